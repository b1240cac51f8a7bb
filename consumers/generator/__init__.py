"""The generator stage (``prompts`` -> ``actions``): the stage (``stage.py``), its backends
(``backends/``: transformers, SGLang, scripted and simulated), the weight swap between batches
(``weight_sync.py``), the chat-templated prompt and the model's limits (``chat.py``), and the next
turn of a multi-turn episode (``turns.py``)."""
