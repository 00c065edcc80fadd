"""A sweep read back from the store for its report: compact jobs, the results snapshot, `load_sweep`."""
