"""The report's tasks, their content cache and the runner (here, a process pool, the report workers); the reduce."""
