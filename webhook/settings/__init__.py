"""Settings: the types (config.py), the topology presets (presets.py) and the settings file
(loading.py)."""
