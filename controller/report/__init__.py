"""From a sweep's results to its reports, in flow order (docs/architecture.md walks it):

- `stats/`: intervals, shares, paired statistics, speed (pure numbers; they render nothing);
- `load/`: the sweep's results read back (compact jobs, the results snapshot, `load_sweep`);
- `compute/`: the report's tasks (a cell's statistics, a pair's comparison), their content cache,
  the runner that runs them here, in a pool or on the report workers, and the reduce (`summarize`);
- `distribute/`: the report workers' side: the signer that enqueues the tasks, the worker's entry
  and `decodebench report-worker`;
- `ratings/`: the human-evaluation round trip (sheets out, scores in);
- `render/`: every format (Markdown, JSON, HTML with its plots and tables) and writing them;
- `api.py`: DataFrames for notebooks.
"""
