"""The core both planes share: the job contract, errors, settings, the plugin registry,
Redis connections and key names, store paths and logging.

It imports nothing else of decodebench (an import contract in pyproject.toml checks it).
"""
