"""The advantage stream (``rewards`` -> ``advantages``): the stage's logic in ``streams/advantages.py``,
open groups in Redis (``streams/groups.py``, Lua in ``streams/lua/``), the output topic
(``streams/output.py``), Faust behind one adapter (``streams/faust_runtime.py``), and the pure
advantage estimators (``streams/estimators.py``)."""
