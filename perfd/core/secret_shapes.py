"""What in a word perfd keeps is a secret by its shape, wherever in the word it sits (docs/security.md,
"Command lines and stacks"). perfd.core.redact keeps only the known-safe words of a command line, and
every word it keeps goes through :func:`scrub`, as does a whole py-spy dump.

Why shapes as well as the allow-list: a safe option's value is free text (``--data-path``,
``--model-name-or-path``, ``--deepspeed '{json}'``, ``--master-addr``), and an attack found 16 of 53
forms passing, most in such values: signed URLs (``X-Amz-Signature=``, Azure ``sig=``, ``?token=``), webhook
URLs whose path is the secret (Slack, Discord, Telegram), ``user:pw@host`` without a scheme, inline
JSON with ``"api_key"``. So, in a kept word:

- a URL keeps its scheme, host and path, and every query and fragment value is masked but those of
  :data:`SAFE_QUERY_KEYS` (an allow-list again: ``alt=media``, ``revision=main``); a ``?name=value``
  query in a word without a scheme the same;
- a webhook's path: all of it on a known webhook host (:data:`WEBHOOK_HOSTS`), and on any host what
  follows a path part that names a hook or a secret (``/hooks/…``, ``/key/…``) or is Telegram's
  ``bot<id>:<token>``;
- user information, with a scheme or without (``admin:pw@10.0.0.1:29500``);
- the value of a ``name=value``, ``name: value`` or JSON ``"name": "value"`` pair whose name is a
  secret's (:func:`secret_name`);
- the token formats of major providers (:data:`SECRET_VALUE`).
"""

from __future__ import annotations

import re
from urllib.parse import quote, unquote

REDACTED = "<redacted>"

# Parts of a name (split at "-", "_" and ".") that make it a secret's: never safe, whatever list it is on.
SECRET_PARTS = frozenset("""
pass passwd password passphrase pwd pw secret secrets token key keys apikey api-key auth authorization
credential credentials cred creds cookie cookies session sid signature sig sign salt hmac bearer cert
certificate private privkey otp pin jwt sas dsn conn connection
""".split())
# Values that are secrets wherever they appear: provider token formats (GitHub, GitLab, Slack, AWS,
# OpenAI, Anthropic, Stripe, Google, Hugging Face, npm, PyPI, SendGrid, DigitalOcean, Shopify,
# Twilio, Azure storage keys, Telegram bots, Slack webhook paths), JSON web tokens, PEM private keys. A
# form whose run of letters is followed by more of its shape starts only where such a run starts: from
# inside a long run every start would scan it again (quadratic time on a long word).
SECRET_VALUE = re.compile(
    r"(?:gh[pousr]_[A-Za-z0-9]{16,}|github_pat_[A-Za-z0-9_]{20,}|glpat-[A-Za-z0-9_-]{16,}|"
    r"xox[abeoprs]-[A-Za-z0-9-]{10,}|xapp-[A-Za-z0-9-]{10,}|(?:AKIA|ASIA)[0-9A-Z]{16}|"
    r"sk-(?:ant-|proj-)?[A-Za-z0-9_-]{16,}|[sr]k_(?:live|test)_[A-Za-z0-9]{10,}|"
    r"hf_[A-Za-z0-9]{20,}|AIza[0-9A-Za-z_-]{30,}|ya29\.[0-9A-Za-z_-]{20,}|npm_[A-Za-z0-9]{30,}|"
    r"pypi-[A-Za-z0-9_-]{30,}|SG\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}|dop_v1_[a-f0-9]{40,}|"
    r"shp(?:at|ss|ca)_[a-fA-F0-9]{20,}|SK[0-9a-fA-F]{32}|AccountKey=[A-Za-z0-9+/=]{20,}|"
    r"(?<![0-9])[0-9]{6,}:AA[A-Za-z0-9_-]{30,}|(?<![A-Z0-9])T[A-Z0-9]{8,}/B[A-Z0-9]{8,}/[A-Za-z0-9]{20,}|"
    r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]+\.?[A-Za-z0-9_.-]*|"
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----)")
# A URL's scheme (git+ssh, postgresql in jdbc:postgresql), at most 32 characters and starting where a
# run of its characters starts: so a long word is scanned once.
_SCHEME = r"(?<![a-z0-9+.-])[a-z][a-z0-9+.-]{0,31}://"
_SCHEME_AT = re.compile(_SCHEME, re.IGNORECASE)
# A word between spaces and quotes with an "@" in it: where user information is looked for.
_RUN = re.compile(r"(?<![^\s\"'])[^\s\"']*@[^\s\"']*")
_URL_USER = re.compile(r"[^/@:]*")  # after "scheme://": the user, up to its "@" or ":"
# ``user:password@host`` without a scheme (``--master-addr admin:pw@10.0.0.1``, Go's ``u:p@tcp(h)/db``):
# a name that starts after one of these characters (or the word's start), then a colon not starting "//".
_BOUNDARY = "=,;()\\[\\]{}<>@:/"
_BARE_USER = re.compile(f"(?<![^{_BOUNDARY}])[^{_BOUNDARY}]*:(?!//)")


def _userinfo(m: re.Match[str]) -> str:
    """A word's user information masked: ``scheme://user:password@``, ``scheme://token@`` and
    ``user:password@`` without a scheme. A password runs to the word's last "@" (one with an "@" or a
    "/" in it is still all masked); so each rule masks at most once a word, in time linear in it."""
    word, last = m[0], m[0].rfind("@")
    out, pos = [], 0
    for s in _SCHEME_AT.finditer(word, 0, last):
        if s.start() < pos:
            continue
        stop = _URL_USER.match(word, s.end())
        end = stop.end() if stop is not None else s.end()
        if word[end] == "@":
            out.append(word[pos:s.end()] + REDACTED)
            pos = end
        elif word[end] == ":" and end < last:
            out.append(word[pos:s.end()] + REDACTED)
            pos = last
            break
    word = "".join(out) + word[pos:]
    last = word.rfind("@")
    after_url = word.rfind("://", 0, last)  # a URL's user information is masked above, its scheme kept
    bare = _BARE_USER.search(word, after_url + 3 if after_url >= 0 else 0, last)
    return word if bare is None else word[:bare.start()] + REDACTED + word[last:]


# Query and fragment keys whose value perfd shows (compared as lower case, "_" as "-"): what says which
# object, version or format is fetched, and a signed URL's parameters that are not its secret.
SAFE_QUERY_KEYS: frozenset[str] = frozenset("""
alt download dl raw format ref rev revision branch tag version versionid generation region expires
x-amz-algorithm x-amz-date x-amz-expires x-amz-signedheaders x-goog-algorithm x-goog-date x-goog-expires
x-goog-signedheaders
""".split())
# Hosts whose URL path is the secret itself (Slack, Discord, Telegram, Zapier, IFTTT, Microsoft Teams,
# Feishu/Lark, PagerDuty, webhook.site); a subdomain counts as its host.
WEBHOOK_HOSTS: frozenset[str] = frozenset("""
hooks.slack.com discord.com discordapp.com api.telegram.org hooks.zapier.com maker.ifttt.com
outlook.office.com webhook.office.com open.feishu.cn open.larksuite.com events.pagerduty.com webhook.site
""".split())
# Path parts after which the rest of a path is the secret, on any host (Mattermost's and Rocket.Chat's
# /hooks/<token>, an API's /key/<key>).
SECRET_SEGMENTS: frozenset[str] = frozenset("""
hook hooks webhook webhooks webhookb2 incomingwebhook token tokens key keys apikey api-key secret secrets
password auth sig signature
""".split())

# A name part that starts or ends so is a secret's too ("dbpassword", "rootpw", "hftoken", "oauth"), and
# a webhook's URL is one ("slack_webhook": its host may be any).
_SECRET_STARTS = ("passw", "passphrase", "passcode", "passkey", "secret", "apikey", "privkey", "privatekey")
_SECRET_ENDS = ("pass", "passwd", "password", "pwd", "pw", "token", "secret", "key", "auth", "cred",
                "creds", "credential", "credentials", "sig", "signature", "cookie", "webhook", "sessionid",
                "sessid")
# Parts that keep an option off the allow-list but name no secret as a key in a value: DeepSpeed's
# "pin_memory", a certificate's path, a connection's name.
_NOT_SECRET_IN_VALUES = frozenset({"pin", "cert", "certificate", "conn", "connection", "sign"})
# A name that is a source file is not a key: "auth.py:12", "token.py:45" in a py-spy frame.
_CODE_SUFFIXES = frozenset("py pyx pyi so c cc cpp cu cuh h hpp rs".split())
_NAME_PARTS = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")  # "X-Amz-Signature", "apiKey"
_JSON_ESCAPE = re.compile(r"\\u([0-9A-Fa-f]{4})")


def secret_name(name: str) -> bool:
    """Whether a key in a value names a secret (``api_key``, ``X-Amz-Security-Token``, ``apiKey``,
    ``PGPASSWORD``, ``SharedAccessSignature``, ``Pwd``)."""
    if "\\u" in name:  # JSON's escapes ("p\\u0061ssword")
        name = _JSON_ESCAPE.sub(lambda m: chr(int(m[1], 16)), name)
    parts = [p.lower() for p in _NAME_PARTS.split(name) if p]
    if len(parts) > 1 and "." in name and parts[-1] in _CODE_SUFFIXES:
        return False
    parts = [p.rstrip("0123456789") or p for p in parts]  # "sid2", "key1"
    return any((p in SECRET_PARTS and p not in _NOT_SECRET_IN_VALUES) or p.startswith(_SECRET_STARTS)
               or p.endswith(_SECRET_ENDS) or (p.startswith("auth") and not p.startswith("author"))
               for p in parts)


def _norm(name: str) -> str:
    return name.lower().replace("_", "-")


# A URL: its scheme, authority, path, and query with fragment; it ends at a space or a quote (JSON).
_URL = re.compile(f"(?P<head>{_SCHEME}" r"(?P<authority>[^/?#\s\"']*))(?P<path>[^?#\s\"']*)"
                  r"(?P<query>[?#][^\s\"']*)?", re.IGNORECASE)
# A query in a word without a scheme: "?" and a "name=" (a glob's "?" has none).
_BARE_QUERY = re.compile(r"\?(?=[\w.~%+-]+=)[^\s\"']*")
_QUERY_ITEM = re.compile(r"(?P<sep>[?#&;])(?P<item>[^?#&;]*)")
_TELEGRAM_BOT = re.compile(r"(?i)^bot[0-9]+:")
_HOOK_LABELS = frozenset({"hook", "hooks", "webhook", "webhooks"})
# Slack's webhook path on any host (a proxy's, a mirror's): /services/T<team>/B<bot>/<secret>.
_SLACK_PATH = re.compile(r"/services/T[A-Z0-9]+/B[A-Z0-9]+/")


def _query(query: str) -> str:
    """A query (or fragment) with every value masked but a safe key's; a bare item (``?<token>``) too."""
    def item(m: re.Match[str]) -> str:
        name, eq, value = m["item"].partition("=")
        if not m["item"] or _norm(name) in SAFE_QUERY_KEYS or (eq and not value):
            return m[0]
        return f"{m['sep']}{name}={REDACTED}" if eq else m["sep"] + REDACTED
    return _QUERY_ITEM.sub(item, query)


def _webhook_host(host: str) -> bool:
    """A known webhook host, or one named as a hook's (``hooks.example.com``, ``webhook.internal``)."""
    return host.split(".", 1)[0] in _HOOK_LABELS or any(host == h or host.endswith("." + h)
                                                           for h in WEBHOOK_HOSTS)


def _path(host: str, path: str) -> str:
    """A URL's path with what is a webhook's secret masked (see the module)."""
    if _webhook_host(host):
        return "/" + REDACTED if path.strip("/") else path
    slack = _SLACK_PATH.search(path)
    if slack is not None:
        return path[:slack.start()] + "/services/" + REDACTED
    parts = path.split("/")
    for i, part in enumerate(parts):
        if _TELEGRAM_BOT.match(part):
            return "/".join([*parts[:i], REDACTED])
        if part.lower() in SECRET_SEGMENTS and any(parts[i + 1:]):
            return "/".join([*parts[:i + 1], REDACTED])
    return path


def _url(m: re.Match[str]) -> str:
    host = m["authority"].rpartition("@")[2].lower()
    host = host.rsplit(":", 1)[0] if host.count(":") == 1 else host  # the port off; IPv6 kept whole
    return m["head"] + _path(host, m["path"]) + _query(m["query"] or "")


# A pair: a name (JSON's \\uXXXX escapes in it read as what they stand for), maybe its closing quote
# (escaped in JSON held in a JSON string: \\"), ":" or "=", and its value: a quoted string (its quotes
# escaped too: --password=\\"x\\" in a JSON string), or an unquoted run to a space, a quote or a list's
# separator; a header's scheme word ("Bearer x") goes with it. A list or an object is all of it
# (_container); a cookie's value runs to the word's end, its ";" and "," included (each is a cookie).
_PAIR_NAME = re.compile(r"(?<![\w.\\-])(?P<name>(?:[\w.-]|\\u[0-9A-Fa-f]{4})+)(?:\\?[\"'])?"
                        r"[ \t]*[:=](?!//)[ \t]*")
_PAIR_VALUE = re.compile(r"(?i:(?:bearer|basic|token|digest)[ \t]+)?"
                         r"(?:\\\"(?:[^\"\\\n]|\\[^\"\n])*(?:\\\")?|\"(?:[^\"\\\n]|\\.)*\"?|'[^'\n]*'?|"
                         r"(?![{\[])[^\s,;&\"'\\]+)")
_COOKIE_VALUE = re.compile(r"[^\s\"']+")
_QUOTE = re.compile(r"\\?[\"']")
# What a list or an object is made of: a string (its escapes in it), a bracket, a run of anything else;
# a newline ends it (in a py-spy dump: the next line is not the value).
_CONTAINER_TOKEN = re.compile(r"\"(?:[^\"\\\n]|\\.)*\"?|'[^'\n]*'?|[\[\]{}\n]|[^\[\]{}\"'\n]+")


def _container(text: str, start: int) -> int:
    """Where the list or object at ``text[start]`` ends (past its closing bracket), or the line's end."""
    depth = 0
    for t in _CONTAINER_TOKEN.finditer(text, start):
        c = t[0]
        if c == "\n":
            return t.start()
        depth += 1 if c in "[{" else -1 if c in "]}" else 0
        if depth == 0:
            return t.end()
    return len(text)


def _pairs(text: str) -> str:
    """``text`` with the value of each pair whose name is a secret's masked, quotes kept. A pair with
    another name keeps its value, which is scanned in turn (``a=b,password=c``, nested JSON)."""
    out, pos = [], 0
    for m in _PAIR_NAME.finditer(text):
        if m.start() < pos or not secret_name(m["name"]):
            continue
        if text.startswith(("[", "{"), m.end()):
            end = _container(text, m.end())
            if end - m.end() == 2:  # [] or {}
                continue
            close = text[end - 1] if end - 1 > m.end() and text[end - 1] in "]}" else ""
            out.append(text[pos:m.end() + 1] + REDACTED + close)
            pos = end
            continue
        cookie = "cookie" in m["name"].lower()
        v = (_COOKIE_VALUE if cookie else _PAIR_VALUE).match(text, m.end())
        if v is None or not v[0]:
            continue
        lead = _QUOTE.match(v[0])
        q = _QUOTE.search(v[0], len(v[0]) - 2) if len(v[0]) > 2 else None
        out.append(text[pos:m.end()] + (lead[0] if lead else "") + REDACTED
                   + (q[0] if q is not None and q.end() == len(v[0]) and q.start() > 0 else ""))
        pos = v.end()
    out.append(text[pos:])
    return "".join(out)


# An element whose name is a secret's (<password>...</password>): its text, to the next "<" on its line.
_ELEMENT = re.compile(r"<(?P<name>[\w.:-]{1,64})>(?P<value>[^<\n]+)")


def _element(m: re.Match[str]) -> str:
    return f"<{m['name']}>{REDACTED}" if secret_name(m["name"]) else m[0]


# ``scheme://user:password@`` whose password holds a quote or a backslash (_RUN cuts a word at a quote
# before it looks for user information): the user, the password to the "@", neither crossing a "/",
# ":", "?", "#" or space, so each scheme's scan ends before the next one's starts.
_QUOTED_USERINFO = re.compile(_SCHEME + r"[^/?#\s\"'@:\\]*:(?=[^/?#\s@:\"'\\]*[\"'\\])[^/?#\s@:]*@",
                              re.IGNORECASE)
# A percent-encoded URL (https%3A%2F%2F...), as a query's value or a whole word: decoded, scanned as a URL
# is, and encoded again around what was masked. It starts where a run starts or after a %XX.
_ENCODED_URL = re.compile(r"(?:(?<![a-z0-9+.%-])|(?<=%[0-9a-f]{2}))[a-z][a-z0-9+.-]{0,31}%3a%2f%2f"
                          r"[\w.~%+-]*", re.IGNORECASE)


def _encoded_url(m: re.Match[str]) -> str:
    url = unquote(m[0])
    masked = _scrub(url)
    if masked == url:
        return m[0]
    return REDACTED.join(quote(part, safe="") for part in masked.split(REDACTED))


def scrub(text: str) -> str:
    """``text`` (a kept word, or a whole py-spy dump) with every secret of a known shape masked (see
    the module). Each rule masks what it finds with REDACTED, so a later one never sees it whole. Each
    runs in time linear in ``text``: a command line can be megabytes long."""
    if "%" in text:
        text = _ENCODED_URL.sub(_encoded_url, text)
    return _scrub(text)


def _scrub(text: str) -> str:
    if "@" in text:
        text = _QUOTED_USERINFO.sub(lambda m: m[0][:m[0].index("://") + 3] + REDACTED + "@", text)
        text = _RUN.sub(_userinfo, text)
    text = _URL.sub(_url, text)
    text = _BARE_QUERY.sub(lambda m: _query(m[0]), text)
    text = _pairs(text)
    text = _ELEMENT.sub(_element, text) if "<" in text else text
    return SECRET_VALUE.sub(REDACTED, text)
