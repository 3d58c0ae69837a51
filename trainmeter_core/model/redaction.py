"""Redaction of secrets in the command line and environment that a run records (meta.json, run details).

Pure functions of their inputs: no I/O, no clock, no globals that change. They must never lengthen, shorten or
reorder a command line, and never hide an option's name: only values are replaced, by ``REDACTED``.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence

REDACTED = "***"

# The last word of a name that marks its value as a secret (see is_secret_name).
_SECRET_LAST_WORDS = frozenset(
    {
        "key",
        "token",
        "secret",
        "password",
        "passwd",
        "passphrase",
        "pwd",
        "credential",
        "credentials",
        "auth",
        "apikey",
        "cookie",
        "signature",
        "webhook",
        "dsn",
    }
)

# Whole names, as upper-case words joined by "_", that hold secrets although their last word says nothing
# (PGPASSWORD is one word; AWS_ACCESS_KEY_ID ends in "id"). The rest repeat names the word rule already
# catches, so the list reads as the catalogue of well-known ones.
_KNOWN_SECRET_NAMES = frozenset(
    {
        "AWS_SECRET_ACCESS_KEY",
        "AWS_ACCESS_KEY_ID",
        "AWS_SESSION_TOKEN",
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "WANDB_API_KEY",
        "PGPASSWORD",
        "NGROK_AUTHTOKEN",
        "AZURE_STORAGE_CONNECTION_STRING",
        "DOCKER_AUTH_CONFIG",
        "SLACK_WEBHOOK_URL",
        "DISCORD_WEBHOOK_URL",
    }
)

_NAME_PARTS = re.compile(r"[-_.]+")
# Case boundaries: "apiKey" -> api, Key; "HFToken" -> HF, Token; "KEY2" -> KEY, 2.
_NAME_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")

# An element of argv that is an option rather than a value: "--verbose", "-v", "--lr=3e-4", or a bare "--".
# "-5" and "-" are values.
_OPTION = re.compile(r"--?[A-Za-z][A-Za-z0-9_.\-]*(=.*)?|--", re.DOTALL)
_DASHED_ASSIGNMENT = re.compile(r"(?P<name>--?[A-Za-z][A-Za-z0-9_.\-]*)=(?P<value>.*)", re.DOTALL)
# Hydra overrides ("logger.wandb.api_key=x", "+trainer.hf_token=x") and `env NAME=x python ...`.
_BARE_ASSIGNMENT = re.compile(r"(?P<name>[+~]{0,2}[A-Za-z_][A-Za-z0-9_.\-/]*)=(?P<value>.*)", re.DOTALL)

# Scheme length is bounded so that scanning a long run of letters stays linear.
_SCHEME = r"[A-Za-z][A-Za-z0-9+.\-]{0,30}://"
# A URL ends at whitespace, a quote or angle bracket, or just before another URL glued to it
# ("https://a/x,https://u:p@b/"): otherwise the second URL's user info would be read as a path.
_URL = re.compile(r"(?P<scheme>" + _SCHEME[:-3] + r")://(?P<body>(?:(?!" + _SCHEME + r")[^\s'\"<>`])*)")

# Path segments are checked only in web URLs: storage and file URLs (s3://, gs://, file://, hf://) name data,
# whose run folders ("run_2024_11_01_abcdef") must stay readable.
_WEB_SCHEMES = frozenset({"http", "https", "ws", "wss"})

_UUID = re.compile(r"[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}")
_LONG_MIXED = re.compile(r"(?=[A-Za-z0-9_\-:.~]*[A-Za-z])(?=[A-Za-z0-9_\-:.~]*[0-9])[A-Za-z0-9_\-:.~]{16,}")
# Telegram bot URLs carry the token as "bot<id>:<secret>" (https://core.telegram.org/bots/api#making-requests).
_TELEGRAM_BOT = re.compile(r"bot[0-9]+:[A-Za-z0-9_\-]+")

# Token shapes that are secret wherever they appear, bounded on the left so "task-..." is not "sk-...".
# Formats: Hugging Face user access tokens (hf_...), GitHub tokens (ghp_/gho_/ghu_/ghs_/ghr_, github_pat_;
# https://github.blog/2021-04-05-behind-githubs-new-authentication-token-formats/), OpenAI and Anthropic keys
# (sk-...), Slack tokens (xoxa/xoxb/xoxp/xoxr; https://api.slack.com/authentication/token-types), AWS access key
# ids (AKIA...; https://docs.aws.amazon.com/IAM/latest/UserGuide/id_credentials_access-keys.html).
_BARE_TOKEN = re.compile(
    r"(?<![A-Za-z0-9_\-])(?:"
    r"hf_[A-Za-z0-9]{30,}"
    r"|gh[pousr]_[A-Za-z0-9]{20,}"
    r"|github_pat_[A-Za-z0-9_]{20,}"
    r"|sk-[A-Za-z0-9_\-]{20,}"
    r"|xox[abpr]-[A-Za-z0-9\-]{10,}"
    r"|AKIA[0-9A-Z]{16}(?![0-9A-Za-z])"
    r")"
)


def _name_words(name: str) -> list[str]:
    """Lower-case words of an option or variable name, split on "-", "_", "." and case boundaries."""
    words: list[str] = []
    for part in _NAME_PARTS.split(name.lstrip("-")):
        words.extend(word.lower() for word in _NAME_WORDS.findall(part))
    return words


def is_secret_name(name: str, extra: Collection[str] = ()) -> bool:
    """Whether an option or environment variable named ``name`` holds a secret.

    The name, without leading dashes, is split on "-", "_", "." and case boundaries into lower-case words.
    It is secret when:

    - its last word (ignoring a trailing number, as in ``API_KEY_2``) is one of key, token, secret, password,
      passwd, passphrase, pwd, credential, credentials, auth, apikey, cookie, signature, webhook, dsn;
    - or its words, upper-cased and joined by "_", are a well-known secret name (``AWS_ACCESS_KEY_ID``,
      ``PGPASSWORD``, ``HF_TOKEN``, ...), so ``--aws-access-key-id`` counts as well;
    - or it is in ``extra`` (names a plugin declares), compared exactly, with or without leading dashes.

    So ``--api-key``, ``--hf_token``, ``--wandb-key``, ``GITHUB_TOKEN`` and ``DB_PASSWORD`` are secret, while
    ``--max-tokens``, ``--key-dim``, ``--secret-file`` and ``TOKENIZERS_PARALLELISM`` stay readable.
    """
    if isinstance(extra, str):
        raise TypeError(f"extra secret names must be a list of names, not the string {extra!r}")
    bare_name = name.lstrip("-")
    if bare_name in {extra_name.lstrip("-") for extra_name in extra}:
        return True
    words = _name_words(name)
    if "_".join(words).upper() in _KNOWN_SECRET_NAMES:
        return True
    while words and words[-1].isdigit():
        words.pop()
    return bool(words) and words[-1] in _SECRET_LAST_WORDS


def _is_token_like(segment: str) -> bool:
    return bool(
        _UUID.fullmatch(segment) or _LONG_MIXED.fullmatch(segment) or _TELEGRAM_BOT.fullmatch(segment)
    )


def _redact_pairs(text: str) -> str:
    """Hide every value of "k=v&k2=v2" keeping the keys; a bare item is hidden when it looks like a token."""
    items = []
    for item in text.split("&"):
        key, equals, value = item.partition("=")
        if equals:
            items.append(f"{key}={REDACTED}" if value else item)
        else:
            items.append(REDACTED if _is_token_like(item) else item)
    return "&".join(items)


def _secret_segment_indexes(host: str, segments: list[str]) -> set[int]:
    """Indexes of path segments that a known webhook service uses as its secret, whatever they look like."""
    named = [index for index, segment in enumerate(segments) if segment]
    if host == "hooks.slack.com":
        # /services/T.../B.../<secret>: the whole path after the first segment is the webhook's credential
        # (https://api.slack.com/messaging/webhooks).
        return set(named[1:])
    if host == "hc-ping.com":
        # /<uuid> or /<ping-key>/<slug>: the first segment is the check's secret (https://healthchecks.io/docs/).
        return set(named[:1])
    return set()


def _redact_url(match: re.Match[str]) -> str:
    scheme, body = match["scheme"], match["body"]
    authority_end = len(body)
    for stop in "/?#":
        position = body.find(stop)
        if position != -1:
            authority_end = min(authority_end, position)
    authority, rest = body[:authority_end], body[authority_end:]
    userinfo, at, host_port = authority.rpartition("@")
    if at and userinfo:
        authority = f"{REDACTED}@{host_port}"

    rest, hash_mark, fragment = rest.partition("#")
    path, question_mark, query = rest.partition("?")
    if scheme.lower() in _WEB_SCHEMES and path:
        host = host_port.rsplit(":", 1)[0].lower() if not host_port.startswith("[") else host_port.lower()
        segments = path.split("/")
        forced = _secret_segment_indexes(host, segments)
        path = "/".join(
            REDACTED if segment and (index in forced or _is_token_like(segment)) else segment
            for index, segment in enumerate(segments)
        )
    if question_mark:
        query = _redact_pairs(query)
    if hash_mark and ("=" in fragment or _is_token_like(fragment)):
        # OAuth's implicit flow returns "#access_token=..." in the fragment.
        fragment = _redact_pairs(fragment)
    return f"{scheme}://{authority}{path}{question_mark}{query}{hash_mark}{fragment}"


def redact_value(text: str) -> str:
    """``text`` with the secrets that its shape gives away replaced by ``REDACTED``.

    In every URL, also one inside a longer string (``--url=https://...``): the user info becomes ``***@``,
    every query-string value (and a "#k=v" fragment's) becomes ``***`` with its key kept, and, in web URLs,
    token-like path segments become ``***``: a UUID, a segment of 16 or more of ``[A-Za-z0-9_-:.~]`` holding
    both a letter and a digit, a Telegram ``bot<id>:<token>`` segment, and the secret part of Slack and
    healthchecks.io webhook paths. Anywhere in the text, well-known token shapes (``hf_...``, ``ghp_...``,
    ``github_pat_...``, ``sk-...``, ``xoxb-...``, ``AKIA...``) become ``***``. Plain paths are left alone.
    """
    return _BARE_TOKEN.sub(REDACTED, _URL.sub(_redact_url, text))


def redact_argv(argv: Sequence[str], extra_names: Collection[str] = ()) -> list[str]:
    """``argv`` with the values of secret options replaced by ``REDACTED``, same length and order.

    ``--name value`` and ``--name=value`` (and ``name=value``, as Hydra overrides and ``env`` write it) whose
    name ``is_secret_name`` keep the name and lose the value: ``--api-key ***``, ``--hf_token=***``. An option
    followed by another option (``--api-key --verbose``) has no value to hide. Every other element goes through
    ``redact_value``.
    """
    redacted: list[str] = []
    value_is_secret = False
    for element in argv:
        if value_is_secret:
            value_is_secret = False
            if not _OPTION.fullmatch(element):
                redacted.append(REDACTED if element else element)
                continue
        assignment = _DASHED_ASSIGNMENT.fullmatch(element) or _BARE_ASSIGNMENT.fullmatch(element)
        if assignment and assignment["value"] and is_secret_name(assignment["name"], extra_names):
            redacted.append(f"{assignment['name']}={REDACTED}")
            continue
        if element.startswith("-") and not assignment and is_secret_name(element, extra_names):
            value_is_secret = True
        redacted.append(redact_value(element))
    return redacted


def redact_env(env: Mapping[str, str], extra_names: Collection[str] = ()) -> dict[str, str]:
    """``env`` with the values of secret names replaced by ``REDACTED`` and every other value through
    ``redact_value``. An empty secret stays empty: nothing is hidden, and "set but empty" explains failed logins.
    """
    return {
        name: (REDACTED if value else value) if is_secret_name(name, extra_names) else redact_value(value)
        for name, value in env.items()
    }
