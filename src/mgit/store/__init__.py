"""The object store family: records, object headers, every `ObjectStore` backend, and how
objects are chosen, written, read, cached and moved between stores.

`base` is the contract (`ObjectStore`) and what all backends share (`writer`: how they
write); `local`, `memory`, `lazy` (a clone that fetches what it lacks), `overlay` (a quarantine over a repository) and
`remote` (a remote's objects, read-only) fulfil it. `objects` and `objectformat` are what is
stored; `codec_policy` and `lossy` decide how a tensor is coded; `reader` reads a version's
tensors back; `quarantine` and `transfer` move objects between a repository and a remote.
`mgit.testing.store` is the contract test every backend passes.

Nothing is imported here, so that a light module (`lossy_policy`, `objects`) loads alone.
"""
