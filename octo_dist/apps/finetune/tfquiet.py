"""TensorFlow's AutoGraph fallback warning, left out of the fine-tune's log.

tf.data converts each Python function it maps with AutoGraph; when it cannot read a function's source it logs, on
every rank and for every such function, six lines ending in::

    AutoGraph could not transform <function ...> and will run it as-is.
    Cause: Unable to locate the source code of <function ...>. ...
    To silence this warning, decorate the function with @tf.autograph.experimental.do_not_convert

"Run it as-is" is what the fork's data transforms need: they are TensorFlow ops with no Python control flow to
convert, so the pipeline is the same either way, and the lines only bury the job's own. ``AUTOGRAPH_VERBOSITY`` set
(TensorFlow's own switch for AutoGraph's log) keeps them.
"""

from __future__ import annotations

import logging
from typing import Mapping

AUTOGRAPH_FALLBACK = "AutoGraph could not transform"  # the start of the warning's template
VERBOSITY_ENV = "AUTOGRAPH_VERBOSITY"


class DropAutographFallback(logging.Filter):
    """Drops the fallback warning's records from the ``tensorflow`` logger; every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(AUTOGRAPH_FALLBACK)


def quiet_autograph(environ: Mapping[str, str]) -> bool:
    """Installs :class:`DropAutographFallback` on TensorFlow's logger (once) unless ``AUTOGRAPH_VERBOSITY`` is set
    in ``environ``; returns whether it is installed."""
    if environ.get(VERBOSITY_ENV):
        return False
    logger = logging.getLogger("tensorflow")
    if not any(isinstance(f, DropAutographFallback) for f in logger.filters):
        logger.addFilter(DropAutographFallback())
    return True
