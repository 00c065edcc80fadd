"""decodebench control plane: sweep spec, planning, submission, status and reports.

Never imports torch.
"""

__version__ = "0.1.0"
