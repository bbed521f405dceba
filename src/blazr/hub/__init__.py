"""Models by name from the Hugging Face Hub: `org/name[:QUANT]` parsed and matched to a repository's files
(names.py), downloaded resumably into huggingface_hub's cache (download.py), resolved cache first or offline
(pull.py), and the cache listed and pruned (cache.py)."""
