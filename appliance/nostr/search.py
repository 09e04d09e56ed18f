"""NIP-50 search words: how a search string splits into words and when content holds them.

The store's full-text index (SQLite FTS5's unicode61 tokenizer) splits text into runs of letters
and digits and folds case and diacritics; these functions do the same in Python, so an event
broadcast live matches a search subscription exactly when the index would find it stored.
"""

from __future__ import annotations

import re
import unicodedata

# A word: letters and digits (unicode61's token characters; `_` and punctuation separate words).
_WORD = re.compile(r"[^\W_]+")


def search_terms(search: str) -> list[str]:
    """The words of a search string, in order, without NIP-50 `key:value` extensions."""
    words: list[str] = []
    for part in search.split():
        if ":" in part:
            continue
        words.extend(_WORD.findall(part))
    return words


def fold(text: str) -> str:
    """Case and diacritics folded, as unicode61 `remove_diacritics 2` folds them."""
    decomposed = unicodedata.normalize("NFKD", text.casefold())
    return "".join(c for c in decomposed if not unicodedata.combining(c))


def content_matches(terms: list[str], content: str) -> bool:
    """Whether `content` holds every term as a word (no terms: nothing matches)."""
    if not terms:
        return False
    words = set(_WORD.findall(fold(content)))
    return all(fold(t) in words for t in terms)
