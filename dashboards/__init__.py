"""Read-only views over the store and MLflow: plots and reports. Nothing here writes to the store."""
