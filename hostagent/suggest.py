"""Did-you-mean for a mistyped word: a command, an option, a config or request key, a name."""

from __future__ import annotations

__all__ = ["closest", "did_you_mean", "unknown"]

_LONGEST = 100           # no name is longer; difflib's time grows with the square of a word


def closest(word: str, candidates) -> str | None:
    """The candidate ``word`` was most likely meant to be, if one is close enough."""
    if len(str(word)) > _LONGEST:
        return None
    import difflib        # here: only a mistake pays for it
    found = difflib.get_close_matches(str(word), [str(c) for c in candidates], n=1, cutoff=0.6)
    return found[0] if found else None


def did_you_mean(word: str, candidates) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``candidates``, or an empty string."""
    match = closest(word, candidates)
    return f" (did you mean {match!r}?)" if match else ""


def unknown(what: str, word: str, candidates) -> str:
    """``unknown key 'devic' (did you mean 'device'?)``."""
    from .textdoc import shown
    return f"unknown {what} {shown(word)}{did_you_mean(word, candidates)}"
