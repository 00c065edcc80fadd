"""The RQ side of the worker: the function RQ calls (`task`), the worker process (`worker`)
and the lost-job reaper (`reaper`)."""
