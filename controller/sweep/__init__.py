"""The sweep spec: its models (`models`), reading it (`load`), its prompts (`prompts`) and
planning it into jobs (`plan`)."""
