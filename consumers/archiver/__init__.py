"""The archiver stage (every topic of a run -> the run archive, ``rollstream/archive.py``):
``stage.py``."""
