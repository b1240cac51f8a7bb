"""The judge's overrides, in the candidate for the length of one request (:func:`apply_env`).

A module of the runtime (standard library only; in the sandbox it arrives in the runtime's
bundle, runtime/importer.py; on the host, an ordinary module). A request carries what the tests
changed that the completion must see as they do: an attribute they patched (a builtin such as
``input``, ``sys.stdin``/``sys.argv``, ``mock.patch`` of a standard-library function, or one
``monkeypatch.delattr`` deleted), the random generator's state where they seeded it, the
environment and the working directory, and whether they handle log records or catch warnings.
:func:`apply_env` applies them for the request (runtime/candidate.py ``serve``) and returns their
undo, which also returns what goes back with the reply: the generator's state and the seed the
completion gave it, the records its loggers handled and the warnings it issued.
"""

import os
import sys

from rollstream.consumers.executor.runtime.codec import clip_text, environ_apply


def apply_env(env, shared):
    """The judge's overrides, for the length of one request; returns their undo, which returns
    what the reply carries back (the random generator's state, the warnings the call issued)."""
    if not env:
        return _nothing
    undo, extras, caught = [], None, None
    undo_logging, logged = [], None
    for index in range(0, len(env) - 1, 2):
        target, value = env[index], env[index + 1]
        if type(target) is not str:
            continue
        if target == "random.state":  # the tests seeded the generator: this call continues their sequence
            import random

            try:
                random.setstate(value)
            except BaseException:
                continue
            _SEEDED.clear()
            if not getattr(random.seed, "_noted", False):
                random.seed = _noting_seed(random.seed)
            extras = extras or []
            extras.append(random)
            continue
        if target == "os.environ":  # the tests changed the environment: so does this process, for good
            if type(value) is list and len(value) == 2 and all(type(v) is str for v in value):
                environ_apply(*value)
            continue
        if target == "os.chdir":  # the tests moved: so does this process, for good
            try:
                os.chdir(value)
            except BaseException:
                pass
            continue
        if target == "logging.capture":  # the tests handle log records: this call's go back to them
            logged = _capture_logs(value, undo_logging)
            continue
        if target == "warnings.capture":  # the tests catch warnings: this call's go back to them
            import warnings

            caught = warnings.catch_warnings(record=True)
            log = caught.__enter__()
            warnings.simplefilter("always")
            continue
        deleted = target[:1] == "-"  # the tests deleted the attribute (monkeypatch.delattr)
        owner_name, _, attribute = target[deleted:].rpartition(".")
        try:
            owner = sys.modules.get(owner_name) or __import__(owner_name) and sys.modules[owner_name]
            old = getattr(owner, attribute, MISSING)
            if not deleted:
                setattr(owner, attribute, value)
            elif old is not MISSING:
                delattr(owner, attribute)
            else:
                continue
        except BaseException:
            continue
        undo.append((owner, attribute, old))

    def restore():
        for owner, attribute, old in reversed(undo):
            if old is MISSING:
                delattr(owner, attribute)
            else:
                setattr(owner, attribute, old)
        for undo_one in reversed(undo_logging):
            undo_one()
        back = []
        if logged:
            back += ["logs", logged]
        if extras:
            back += ["random", [extras[0].getstate(), _SEEDED[-1] if _SEEDED else None]]
        if caught is not None:
            caught.__exit__(None, None, None)
            back += ["warnings", [[w.message if isinstance(w.message, Warning) else w.category(str(w.message)),
                                   None, str(w.filename)[:500], w.lineno if type(w.lineno) is int else 0]
                                  for w in log[:1000]]]
        return back or None

    return restore


MISSING = object()  # an attribute or a name that was not there
_SEEDED = []  # the last seed the completion gave random.seed during this call (the judge checks the state against it)


def _noting_seed(seed):
    def noting(a=None, version=2):
        _SEEDED[:] = [[a, version] if type(a) in (int, str, bytes, float) else None]
        return seed(a, version)

    noting._noted = True
    return noting


def _capture_logs(levels, undo):
    """For one call: the tests' logger levels here, and every record the completion's loggers
    handle also sent back (its own handlers still run; the interpreter's last-resort handler does
    not, the tests' side has handlers). Returns the list the records go to."""
    logging = sys.modules.get("logging")
    if logging is None or type(levels) is not list:
        return None
    for index in range(0, len(levels) - 1, 2):
        name, level = levels[index], levels[index + 1]
        if type(name) is str and type(level) is int:
            logger = logging.getLogger(name or None)
            undo.append(lambda logger=logger, level=logger.level: logger.setLevel(level))
            logger.setLevel(level)
    records = []
    handle_all = logging.Logger.callHandlers

    def forwarding(self, record):
        if len(records) < 1000:
            try:
                records.append(_log_record(logging, record))
            except BaseException:  # a record the completion made unreadable: not sent
                pass
        handle_all(self, record)

    manager, last_resort = logging.Logger.manager, logging.lastResort
    warned = manager.emittedNoHandlerWarning
    logging.Logger.callHandlers, logging.lastResort, manager.emittedNoHandlerWarning = forwarding, None, True

    def restore():
        logging.Logger.callHandlers, logging.lastResort = handle_all, last_resort
        manager.emittedNoHandlerWarning = warned
    undo.append(restore)
    return records


def _log_record(logging, record):
    try:
        message = record.getMessage()
    except BaseException:
        message = clip_text(record.msg, 10000)
    exc_text = None
    if record.exc_info:
        try:
            exc_text = logging.Formatter().formatException(record.exc_info)
        except BaseException:
            exc_text = None
    return [clip_text(record.name, 500), int(record.levelno), clip_text(record.levelname, 100), str(message)[:10000],
            clip_text(record.pathname, 500), int(record.lineno or 0), clip_text(record.funcName, 200),
            None if exc_text is None else exc_text[:10000], float(record.created)]


def _nothing():
    return None
