"""A logger's level follows the calls in flight: lowered while one asks for less, back when the
last such call ends, and a record below every level in flight is never made."""

from __future__ import annotations

import logging
import threading

from rdmanet.cni.core.log_levels import LevelGate


class Made(logging.Handler):
    """Counts the records that reach it (made at all), whatever their level."""

    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.levels: list[int] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.levels.append(record.levelno)


def logger_with_handler(name: str) -> tuple[logging.Logger, Made]:
    logger = logging.getLogger(name)
    logger.propagate = False
    made = Made()
    logger.handlers = [made]
    return logger, made


def test_the_level_is_the_lowest_in_flight_and_comes_back():
    logger, made = logger_with_handler("rdmanet.test.gate")
    gate = LevelGate(logger, logging.WARNING)
    gate.set_base(logging.WARNING)
    logger.debug("before")
    with gate.hold(logging.INFO):
        with gate.hold(logging.DEBUG):
            assert logger.level == logging.DEBUG
            logger.debug("both held")
        assert logger.level == logging.INFO
        logger.debug("only INFO held")  # not made
        logger.info("only INFO held")
    assert logger.level == logging.WARNING
    logger.info("after")
    assert made.levels == [logging.DEBUG, logging.INFO]


def test_a_hold_at_or_above_the_base_or_none_changes_nothing():
    logger, made = logger_with_handler("rdmanet.test.gate-noop")
    gate = LevelGate(logger, logging.WARNING)
    gate.set_base(logging.WARNING)
    with gate.hold(logging.ERROR), gate.hold(None):
        assert logger.level == logging.WARNING
        logger.warning("kept")
    assert made.levels == [logging.WARNING]


def test_a_notset_base_inherits_the_parent_outside_holds():
    parent, _ = logger_with_handler("rdmanet.test.parent")
    parent.setLevel(logging.ERROR)
    child = logging.getLogger("rdmanet.test.parent.child")
    gate = LevelGate(child, logging.NOTSET)
    with gate.hold(logging.DEBUG):
        assert child.getEffectiveLevel() == logging.DEBUG
    assert child.level == logging.NOTSET and child.getEffectiveLevel() == logging.ERROR


def test_holds_of_concurrent_calls_count_each_other():
    """Two calls in flight on two threads: the one that ends first does not raise the level
    under the other."""
    logger, made = logger_with_handler("rdmanet.test.gate-threads")
    gate = LevelGate(logger, logging.WARNING)
    first_in, second_done = threading.Event(), threading.Event()

    def first() -> None:
        with gate.hold(logging.DEBUG):
            first_in.set()
            second_done.wait(10)
            logger.debug("first, after the second ended")

    thread = threading.Thread(target=first)
    thread.start()
    first_in.wait(10)
    with gate.hold(logging.DEBUG):
        pass
    second_done.set()
    thread.join(10)
    assert made.levels == [logging.DEBUG]
    assert logger.level == logging.WARNING
