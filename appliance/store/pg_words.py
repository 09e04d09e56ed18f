"""The word rule of NIP-50 search (nostr/search.py) as PostgreSQL regular expressions.

The live matcher and SQLite's FTS5 index split text into runs of letters and digits (Python's
`str.isalnum`: `_` and punctuation separate words) and fold case and diacritics (NFKD, combining
marks dropped). PostgreSQL's own text search parser keeps `heron.egret`, URLs, paths and e-mail
addresses as single tokens, so a search for `heron` missed events the matcher finds live. The
PostgreSQL schema (migration 7) runs every text it indexes, and every search string, through
`appliance_search_words`, built from these tables: code point ranges (hex) of the characters
`str.isalnum` holds true and of those with a non-zero combining class, as of Unicode 14.0
(Python 3.11; unassigned code points are joined to the ranges around them). They are the text of
a shipped migration: never edit them; a change is a new migration.
"""

from __future__ import annotations

WORD_RANGES = """
    30-39 41-5a 61-7a aa b2-b3 b5 b9-ba bc-be c0-d6 d8-f6 f8-2c1 2c6-2d1 2e0-2e4 2ec 2ee 370-374 376-37d 37f 386
    388-3f5 3f7-481 48a-559 560-588 5d0-5f2 620-64a 660-669 66e-66f 671-6d3 6d5 6e5-6e6 6ee-6fc 6ff 710 712-72f
    74d-7a5 7b1-7ea 7f4-7f5 7fa 800-815 81a 824 828 840-858 860-887 889-88e 8a0-8c9 904-939 93d 950 958-961
    966-96f 971-980 985-9b9 9bd 9ce 9dc-9e1 9e6-9f1 9f4-9f9 9fc a05-a39 a59-a6f a72-a74 a85-ab9 abd ad0-ae1
    ae6-aef af9 b05-b39 b3d b5c-b61 b66-b6f b71-b77 b83-bb9 bd0 be6-bf2 c05-c39 c3d c58-c61 c66-c6f c78-c7e c80
    c85-cb9 cbd cdd-ce1 ce6-cf2 d04-d3a d3d d4e d54-d56 d58-d61 d66-d78 d7a-d7f d85-dc6 de6-def e01-e30 e32-e33
    e40-e46 e50-e59 e81-eb0 eb2-eb3 ebd-ec6 ed0-f00 f20-f33 f40-f6c f88-f8c 1000-102a 103f-1049 1050-1055
    105a-105d 1061 1065-1066 106e-1070 1075-1081 108e 1090-1099 10a0-10fa 10fc-135a 1369-138f 13a0-13fd 1401-166c
    166f-167f 1681-169a 16a0-16ea 16ee-1711 171f-1731 1740-1751 1760-1770 1780-17b3 17d7 17dc 17e0-17f9 1810-1884
    1887-18a8 18aa-191e 1946-19da 1a00-1a16 1a20-1a54 1a80-1a99 1aa7 1b05-1b33 1b45-1b59 1b83-1ba0 1bae-1be5
    1c00-1c23 1c40-1c7d 1c80-1cbf 1ce9-1cec 1cee-1cf3 1cf5-1cf6 1cfa-1dbf 1e00-1fbc 1fbe 1fc2-1fcc 1fd0-1fdb
    1fe0-1fec 1ff2-1ffc 2070-2079 207f-2089 2090-209c 2102 2107 210a-2113 2115 2119-211d 2124 2126 2128 212a-212d
    212f-2139 213c-213f 2145-2149 214e 2150-2189 2460-249b 24ea-24ff 2776-2793 2c00-2ce4 2ceb-2cee 2cf2-2cf3 2cfd
    2d00-2d6f 2d80-2dde 2e2f 3005-3007 3021-3029 3031-3035 3038-303c 3041-3096 309d-309f 30a1-30fa 30fc-318e
    3192-3195 31a0-31bf 31f0-31ff 3220-3229 3248-324f 3251-325f 3280-3289 32b1-32bf 3400-4dbf 4e00-a48c a4d0-a4fd
    a500-a60c a610-a66e a67f-a69d a6a0-a6ef a717-a71f a722-a788 a78b-a801 a803-a805 a807-a80a a80c-a822 a830-a835
    a840-a873 a882-a8b3 a8d0-a8d9 a8f2-a8f7 a8fb a8fd-a8fe a900-a925 a930-a946 a960-a97c a984-a9b2 a9cf-a9d9
    a9e0-a9e4 a9e6-aa28 aa40-aa42 aa44-aa4b aa50-aa59 aa60-aa76 aa7a aa7e-aaaf aab1 aab5-aab6 aab9-aabd aac0
    aac2-aadd aae0-aaea aaf2-aaf4 ab01-ab5a ab5c-ab69 ab70-abe2 abf0-d7fb f900-fb1d fb1f-fb28 fb2a-fbb1 fbd3-fd3d
    fd50-fdc7 fdf0-fdfb fe70-fefc ff10-ff19 ff21-ff3a ff41-ff5a ff66-ffdc 10000-100fa 10107-10133 10140-10178
    1018a-1018b 10280-102d0 102e1-10375 10380-1039d 103a0-103cf 103d1-10563 10570-10855 10858-10876 10879-1091b
    10920-10939 10980-10a00 10a10-10a35 10a40-10a48 10a60-10a7e 10a80-10ac7 10ac9-10ae4 10aeb-10aef 10b00-10b35
    10b40-10b91 10ba9-10d23 10d30-10ea9 10eb0-10f45 10f51-10f54 10f70-10f81 10fb0-10ff6 11003-11037 11052-1106f
    11071-11072 11075 11083-110af 110d0-110f9 11103-11126 11136-1113f 11144 11147-11172 11176 11183-111b2
    111c1-111c4 111d0-111da 111dc 111e1-1122b 11280-112a8 112b0-112de 112f0-112f9 11305-11339 1133d 11350
    1135d-11361 11400-11434 11447-1144a 11450-11459 1145f-114af 114c4-114c5 114c7-115ae 115d8-115db 11600-1162f
    11644-11659 11680-116aa 116b8 116c0-1171a 11730-1173b 11740-1182b 118a0-1192f 1193f 11941 11950-119d0 119e1
    119e3 11a00 11a0b-11a32 11a3a 11a50 11a5c-11a89 11a9d 11ab0-11c2e 11c40 11c50-11c6c 11c72-11c8f 11d00-11d30
    11d46 11d50-11d89 11d98-11ef2 11fb0-11fd4 12000-1246e 12480-12ff0 13000-1342e 14400-16a69 16a70-16aed
    16b00-16b2f 16b40-16b43 16b50-16e96 16f00-16f4a 16f50 16f93-16fe1 16fe3 17000-1bc99 1d2e0-1d2f3 1d360-1d6c0
    1d6c2-1d6da 1d6dc-1d6fa 1d6fc-1d714 1d716-1d734 1d736-1d74e 1d750-1d76e 1d770-1d788 1d78a-1d7a8 1d7aa-1d7c2
    1d7c4-1d7ff 1df00-1df1e 1e100-1e12c 1e137-1e14e 1e290-1e2ad 1e2c0-1e2eb 1e2f0-1e2f9 1e7e0-1e8cf 1e900-1e943
    1e94b-1e959 1ec71-1ecab 1ecad-1ecaf 1ecb1-1ed2d 1ed2f-1eebb 1f100-1f10c 1fbf0-3134a
"""

MARK_RANGES = """
    300-34e 350-36f 483-487 591-5bd 5bf 5c1-5c2 5c4-5c5 5c7 610-61a 64b-65f 670 6d6-6dc 6df-6e4 6e7-6e8 6ea-6ed
    711 730-74a 7eb-7f3 7fd 816-819 81b-823 825-827 829-82d 859-85b 898-89f 8ca-8e1 8e3-8ff 93c 94d 951-954 9bc
    9cd 9fe a3c a4d abc acd b3c b4d bcd c3c c4d-c56 cbc ccd d3b-d3c d4d dca e38-e3a e48-e4b eb8-eba ec8-ecb
    f18-f19 f35 f37 f39 f71-f72 f74 f7a-f7d f80 f82-f84 f86-f87 fc6 1037 1039-103a 108d 135d-135f 1714-1715 1734
    17d2 17dd 18a9 1939-193b 1a17-1a18 1a60 1a75-1a7f 1ab0-1abd 1abf-1ace 1b34 1b44 1b6b-1b73 1baa-1bab 1be6
    1bf2-1bf3 1c37 1cd0-1cd2 1cd4-1ce0 1ce2-1ce8 1ced 1cf4 1cf8-1cf9 1dc0-1dff 20d0-20dc 20e1 20e5-20f0 2cef-2cf1
    2d7f 2de0-2dff 302a-302f 3099-309a a66f a674-a67d a69e-a69f a6f0-a6f1 a806 a82c a8c4 a8e0-a8f1 a92b-a92d a953
    a9b3 a9c0 aab0 aab2-aab4 aab7-aab8 aabe-aabf aac1 aaf6 abed fb1e fe20-fe2f 101fd 102e0 10376-1037a 10a0d 10a0f
    10a38-10a3f 10ae5-10ae6 10d24-10d27 10eab-10eac 10f46-10f50 10f82-10f85 11046 11070 1107f 110b9-110ba
    11100-11102 11133-11134 11173 111c0 111ca 11235-11236 112e9-112ea 1133b-1133c 1134d 11366-11374 11442 11446
    1145e 114c2-114c3 115bf-115c0 1163f 116b6-116b7 1172b 11839-1183a 1193d-1193e 11943 119e0 11a34 11a47 11a99
    11c3f 11d42 11d44-11d45 11d97 16af0-16af4 16b30-16b36 16ff0-16ff1 1bc9e 1d165-1d169 1d16d-1d172 1d17b-1d182
    1d185-1d18b 1d1aa-1d1ad 1d242-1d244 1e000-1e02a 1e130-1e136 1e2ae 1e2ec-1e2ef 1e8d0-1e8d6 1e944-1e94a
"""


def bracket(ranges: str) -> str:
    """A PostgreSQL regular expression bracket expression's inside (no brackets) for `ranges`."""
    def char(hexdigits: str) -> str:
        n = int(hexdigits, 16)
        return f"\\u{n:04x}" if n <= 0xFFFF else f"\\U{n:08x}"

    parts = []
    for item in ranges.split():
        lo, _, hi = item.partition("-")
        parts.append(char(lo) if not hi else f"{char(lo)}-{char(hi)}")
    return "".join(parts)


# The characters of words, and the combining marks folding drops (inside a bracket expression).
WORD_CLASS = bracket(WORD_RANGES)
MARK_CLASS = bracket(MARK_RANGES)
