"""Porcelain: the Hugging Face cache, imported into a repository and exported from it.

`import_cache(repo)` makes every model repository of the cache huggingface_hub downloads
into a model, each cached revision a version, with lineage from the model cards
(mgit.hf.importing); `export_to_cache(repo, "org/name@2")` writes a version back in that
layout, so that transformers loads it offline (mgit.hf.exporting). mgit.hf.cache reads the
cache through huggingface_hub (the `hf` extra), imported only when one of these runs.
"""

from mgit.hf.exporting import ExportResult, export_to_cache
from mgit.hf.importing import ImportedRevision, ImportResult, import_cache, model_name

__all__ = ["ExportResult", "ImportResult", "ImportedRevision", "export_to_cache", "import_cache", "model_name"]
