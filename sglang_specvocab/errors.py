"""The one exception type users see: its message is the whole explanation."""


class SpecVocabError(ValueError):
    """Bad input (config, trace, arguments): the message names what and where."""


class ConfigError(SpecVocabError):
    """A policy config that cannot be used; the message names file, key, value and what is valid."""


class TraceError(SpecVocabError):
    """A replay trace that cannot be used; the message names file, line and field."""
