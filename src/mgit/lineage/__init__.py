"""The lineage graph and parent inference: `graph` (queries over models and versions),
`sketch` (a small summary of a version's tensors), `evidence` (one sketch compared with
another) and `inference` (ranking stored versions as the parent of a model).
"""
