"""The report in every format: numbers, Markdown, JSON, the offline HTML page with its plots and tables."""
