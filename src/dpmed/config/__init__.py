"""Configuration: schema validation, semantic checks and grid expansion for the Snakefile."""
