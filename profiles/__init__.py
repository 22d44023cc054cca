"""specx deployment profiles (TOML data shipped with the package)."""
