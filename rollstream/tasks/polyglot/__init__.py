"""The built-in polyglot suite: stdin/stdout problems in C, C++, Java, JavaScript, Go and Rust (source
``suite:polyglot``).

``build.py`` writes ``<language>.jsonl`` here from the problems it holds and the programs of
programs.py; tasks/sources.py loads them.
"""
