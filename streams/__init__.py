"""The advantage stream (``streams/advantages.py``: ``rewards`` -> ``advantages``, Faust with open
groups in Redis) and the pure advantage estimators."""
