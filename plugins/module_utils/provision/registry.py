# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""An OCI registry, read over its HTTP API (distribution spec v2) with the credentials of the usual containers
auth file: does it answer, does it want credentials that are absent, does it hold a tag, and the labels of that
tag's image.  Credentials go from the auth file into request headers only (never an argv, a log or a result).

``Registry`` takes an ``opener`` (``urllib``'s ``OpenerDirector``) so that unit tests answer for the registry.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import json
import os
import re
import ssl

from urllib.error import HTTPError, URLError
from urllib.parse import urlencode, urlsplit
from urllib.request import (HTTPDefaultErrorHandler, HTTPErrorProcessor, HTTPHandler, HTTPRedirectHandler,
                            HTTPSHandler, OpenerDirector, Request, UnknownHandler)

# registry/name[:tag]: the registry part names a host (a dot or a port) or localhost.
REFERENCE_RE = re.compile(r"^(?:(?P<registry>[A-Za-z0-9.-]+(?::[0-9]+)?|\[[0-9a-fA-F:]+\](?::[0-9]+)?)/)?"
                          r"(?P<repository>[a-z0-9]+(?:[._-]+[a-z0-9]+)*(?:/[a-z0-9]+(?:[._-]+[a-z0-9]+)*)*)"
                          r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
                          r"(?:@(?P<digest>sha256:[0-9a-f]{64}))?$")
REGISTRY_RE = re.compile(r"^(?:[A-Za-z0-9.-]+|\[[0-9a-fA-F:]+\])(?::[0-9]+)?$")
DOCKER_HUB = "docker.io"
# Docker Hub's API is not served at docker.io itself.
API_HOSTS = {DOCKER_HUB: "registry-1.docker.io"}
MANIFEST_TYPES = ("application/vnd.oci.image.manifest.v1+json", "application/vnd.oci.image.index.v1+json",
                  "application/vnd.docker.distribution.manifest.v2+json",
                  "application/vnd.docker.distribution.manifest.list.v2+json")
INDEX_TYPES = ("application/vnd.oci.image.index.v1+json",
               "application/vnd.docker.distribution.manifest.list.v2+json")
AUTH_RE = re.compile(r'(\w+)="([^"]*)"')
# The label that names the stack an image holds (image.yml writes it, the kubernetes backend reads it).
FINGERPRINT_LABEL = "io.github.multinode.deepspeed.stack-fingerprint"


class RegistryError(Exception):
    """The registry cannot be read: ``kind`` is ``unreachable``, ``credentials`` or ``error``."""

    def __init__(self, kind, message):
        super(RegistryError, self).__init__(message)
        self.kind = kind


def parse_reference(ref):
    """``(registry, repository, tag or digest)`` of an image reference; registry ``docker.io`` when the first part
    names no host; tag ``latest`` when none; None when it is not a reference."""
    text = str(ref or "").strip()
    match = REFERENCE_RE.match(text)
    if not match:
        return None
    registry, repository = match.group("registry"), match.group("repository")
    if registry and not ("." in registry or ":" in registry or registry == "localhost" or registry.startswith("[")):
        # docker.io/library style: the first part was a path component, not a host.
        repository, registry = registry.lower() + "/" + repository, None
        if not REFERENCE_RE.match(repository):
            return None
    registry = registry or DOCKER_HUB
    if registry == DOCKER_HUB and "/" not in repository:
        repository = "library/" + repository
    # A digest names the manifest itself (the API takes it where a tag goes).
    return registry, repository, match.group("digest") or match.group("tag") or "latest"


def stack_image(registry, name, fingerprints, venv):
    """``(reference, problem)``: image.yml's image of the stack the rank nodes hold -- ``<registry>/<name>:<their
    fingerprint>`` -- or None and why not (no registry, nodes not provisioned, nodes whose stacks differ)."""
    if not registry:
        return None, ("k8s_image is not set and image_registry is not set either. Fix: -e image_registry=<the "
                      "registry image.yml pushes the stack's image to> (ansible-playbook image.yml builds it), or "
                      "-e k8s_image=<an image with the stack's venv at %s>" % venv)
    if not REGISTRY_RE.match(str(registry)):
        return None, "image_registry=%r is not a registry (host or host:port). Fix: -e image_registry=" \
                     "registry.example.org:5000" % (registry,)
    missing = sorted(h for h, fp in fingerprints.items() if not fp)
    if missing:
        return None, ("the stack of %s is unknown (no venv there: not provisioned), so the stack's image is "
                      "unknown. Fix: ansible-playbook site.yml, or -e k8s_image=<an image>" % ", ".join(missing))
    found = sorted(set(fingerprints.values()))
    if len(found) > 1:
        return None, ("the rank nodes hold different stacks (%s), so no one image matches them. Fix: ansible-playbook "
                      "site.yml (one stack everywhere), then image.yml" % ", ".join(
                          "%s: %s" % (h, fp) for h, fp in sorted(fingerprints.items())))
    if not found:
        return None, "no rank node to take the stack from. Fix: -e k8s_image=<an image>"
    return "%s/%s:%s" % (registry, name, found[0]), None


def auth_file_candidates(env=None, home=None):
    """Where podman, buildah, skopeo and containerd's clients look for credentials, in their order."""
    env = os.environ if env is None else env
    home = home or os.path.expanduser("~")
    out = []
    if env.get("REGISTRY_AUTH_FILE"):
        out.append(env["REGISTRY_AUTH_FILE"])
    if env.get("XDG_RUNTIME_DIR"):
        out.append(os.path.join(env["XDG_RUNTIME_DIR"], "containers", "auth.json"))
    out.append(os.path.join(home, ".config", "containers", "auth.json"))
    out.append(os.path.join(env.get("DOCKER_CONFIG") or os.path.join(home, ".docker"), "config.json"))
    return out


def credentials(registry, auth_file=None, env=None, home=None):
    """``(user, password, path)`` for ``registry`` from the first auth file that has it, or ``(None, None, None)``.
    ``auth_file`` (given): only that file."""
    paths = [auth_file] if auth_file else auth_file_candidates(env, home)
    keys = [registry, "https://" + registry, "http://" + registry]
    if registry == DOCKER_HUB:
        keys += ["https://index.docker.io/v1/", "index.docker.io", "registry-1.docker.io"]
    for path in paths:
        try:
            with open(os.path.expanduser(path)) as fh:
                data = json.load(fh)
        except (OSError, IOError, ValueError):
            continue
        auths = data.get("auths") if isinstance(data, dict) else None
        for key in keys:
            entry = (auths or {}).get(key)
            if isinstance(entry, dict) and entry.get("auth"):
                try:
                    user, _sep, password = base64.b64decode(entry["auth"]).decode("utf-8").partition(":")
                except (ValueError, UnicodeDecodeError):
                    continue
                return user, password, path
    return None, None, None


def challenge(header):
    """``(scheme, params)`` of a ``WWW-Authenticate`` header: ``("bearer", {"realm": ..., "service": ...})``."""
    scheme, _sep, rest = (header or "").strip().partition(" ")
    return scheme.lower(), dict(AUTH_RE.findall(rest))


# Token services that are not on the registry's own host, known for the registries that use one.
TOKEN_HOSTS = {DOCKER_HUB: ("auth.docker.io",)}


class _Redirects(HTTPRedirectHandler):
    """Redirects to HTTPS only (and plain HTTP with ``insecure``): never to another scheme, never down to HTTP."""

    def __init__(self, schemes):
        self.schemes = schemes

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        if urlsplit(newurl).scheme.lower() not in self.schemes:
            raise HTTPError(newurl, code, "refusing a redirect to %s (only %s)" % (
                urlsplit(newurl).scheme or "a relative address", ", ".join(self.schemes)), headers, fp)
        return HTTPRedirectHandler.redirect_request(self, req, fp, code, msg, headers, newurl)


def make_opener(insecure=False):
    """An opener that speaks HTTPS only (``insecure``: without certificate checks, and plain HTTP too): urllib's
    default one also opens ``file:``, ``ftp:`` and ``data:`` addresses, which a registry's 401 could name as its
    token service."""
    context = ssl.create_default_context()
    if insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    opener = OpenerDirector()
    handlers = [HTTPSHandler(context=context), UnknownHandler(), HTTPDefaultErrorHandler(), HTTPErrorProcessor(),
                _Redirects(("https", "http") if insecure else ("https",))]
    if insecure:
        handlers.append(HTTPHandler())
    for handler in handlers:
        opener.add_handler(handler)
    return opener


def realm_problem(realm, host, insecure=False, token_hosts=()):
    """Why the token service ``realm`` of registry ``host`` is not asked (None: it may be): not HTTPS (plain HTTP
    only with ``insecure``), or on a host that is neither the registry's, nor its known token service, nor named in
    ``token_hosts`` (the registry's 401 names the realm; the request to it carries the auth file's credentials)."""
    parts = urlsplit(str(realm))
    if parts.scheme.lower() not in (("https", "http") if insecure else ("https",)) or not parts.hostname:
        return "its token service %r is not an https:// address" % (realm,)
    allowed = set(h.lower() for h in tuple(token_hosts or ()) + TOKEN_HOSTS.get(host, ()))
    allowed.update(h.lower().rsplit(":", 1)[0].strip("[]") for h in (host, API_HOSTS.get(host, host)))
    if parts.hostname.lower() not in allowed:
        return ("its token service %s is on another host (%s) than the registry: not asked unless "
                "image_registry_token_hosts names %s" % (realm, parts.hostname, parts.hostname))
    return None


class Registry(object):
    """One registry's API: ``https://<host>/v2/`` (``insecure``: without certificate checks, then plain HTTP)."""

    def __init__(self, host, insecure=False, user=None, password=None, timeout=10, opener=None, token_hosts=()):
        self.host = host
        self.insecure = insecure
        self.user, self.password = user, password
        self.timeout = timeout
        self.token_hosts = tuple(token_hosts or ())
        self.opener = make_opener(insecure) if opener is None else opener
        self.scheme = None
        self.token = None
        self.auth = None

    def _basic(self):
        raw = ("%s:%s" % (self.user, self.password)).encode("utf-8")
        return "Basic " + base64.b64encode(raw).decode("ascii")

    def _open(self, method, url, headers):
        headers = dict(headers)
        auth = headers.pop("Authorization", None)
        req = Request(url, headers=headers)
        if auth:
            # Never sent on to where a redirect points (a blob store, another host).
            req.add_unredirected_header("Authorization", auth)
        req.get_method = lambda: method
        return self.opener.open(req, timeout=self.timeout)

    def _authorize(self, header, scope):
        """Answer a 401's challenge: Basic with the auth file's credentials, or a Bearer token from its realm."""
        scheme, params = challenge(header)
        if scheme == "basic":
            if self.user is None:
                raise RegistryError("credentials", "it wants credentials (Basic) and the auth file has none for %s"
                                    % self.host)
            self.auth = self._basic()
            return
        if scheme != "bearer" or not params.get("realm"):
            raise RegistryError("error", "it answers 401 with an authentication scheme this check does not "
                                         "know: %r" % (header or "")[:100])
        query = dict((k, v) for k, v in (("service", params.get("service")), ("scope", scope)) if v)
        url = params["realm"] + ("?" + urlencode(query) if query else "")
        problem = realm_problem(params["realm"], self.host, True, self.token_hosts)
        if problem:
            raise RegistryError("error", problem)
        if self.user is not None and not url.startswith("https://") and not self.insecure:
            raise RegistryError("credentials", "its token service %s is not HTTPS: the auth file's credentials are "
                                               "not sent there without image_registry_insecure=true" % params["realm"])
        headers = {"Authorization": self._basic()} if self.user is not None else {}
        try:
            res = self._open("GET", url, headers)
            body = json.loads(res.read().decode("utf-8") or "{}")
        except HTTPError as exc:
            if self.user is None:
                raise RegistryError("credentials", "it wants credentials (a token from %s, HTTP %d without them) "
                                                   "and the auth file has none for %s" % (params["realm"], exc.code,
                                                                                          self.host))
            if exc.code in (401, 403):
                raise RegistryError("credentials", "its token service %s refused %s (HTTP %d)" % (
                    params["realm"], "the auth file's credentials" if self.user is not None else
                    "an anonymous token and the auth file has no credentials for %s" % self.host, exc.code))
            raise RegistryError("error", "its token service %s answers HTTP %d" % (params["realm"], exc.code))
        except (URLError, OSError, ValueError) as exc:
            raise RegistryError("unreachable", "its token service %s does not answer: %s"
                                % (params["realm"], _reason(exc)))
        token = (body.get("token") or body.get("access_token")) if isinstance(body, dict) else None
        if not token:
            raise RegistryError("error", "its token service %s returned no token" % params["realm"])
        self.auth = "Bearer " + token

    def request(self, method, path, accept=None, scope=None):
        """``(status, headers, body)`` of ``method /v2/<path>``; 404 is a status, anything else raises."""
        schemes = [self.scheme] if self.scheme else (["https", "http"] if self.insecure else ["https"])
        last = None
        for scheme in schemes:
            url = "%s://%s/v2/%s" % (scheme, API_HOSTS.get(self.host, self.host), path)
            for _attempt in range(2):
                headers = {"Accept": ", ".join(accept)} if accept else {}
                if self.auth:
                    headers["Authorization"] = self.auth
                try:
                    res = self._open(method, url, headers)
                    self.scheme = scheme
                    return res.getcode(), dict(res.headers.items()), res.read() if method != "HEAD" else b""
                except HTTPError as exc:
                    self.scheme = scheme
                    if exc.code == 401 and _attempt == 0:
                        if self.auth and self.auth.startswith("Basic"):
                            raise RegistryError("credentials", "it refuses the auth file's credentials for %s"
                                                % self.host)
                        self._authorize(header(exc.headers, "WWW-Authenticate"), scope)
                        continue
                    if exc.code == 401:
                        raise RegistryError("credentials", "it refuses the credentials for %s" % self.host)
                    if exc.code == 404:
                        return 404, dict(exc.headers.items()), b""
                    if exc.code == 403:
                        raise RegistryError("credentials", "it forbids %s %s to these credentials" % (method, path))
                    raise RegistryError("error", "it answers HTTP %d to %s /v2/%s" % (exc.code, method, path))
                except (URLError, OSError) as exc:
                    last = exc
                    break
        raise RegistryError("unreachable", "%s does not answer: %s" % (self.host, _reason(last)))

    def ping(self):
        """The API answers (with these credentials, when it wants some)."""
        status, _h, _b = self.request("GET", "", scope=None)
        if status == 404:
            raise RegistryError("error", "%s answers 404 to /v2/: it is not an OCI registry" % self.host)

    def manifest(self, repository, tag):
        """``(digest, manifest)`` of a tag, or ``(None, None)`` when the registry has no such tag."""
        scope = "repository:%s:pull" % repository
        status, headers, body = self.request("GET", "%s/manifests/%s" % (repository, tag), MANIFEST_TYPES, scope)
        if status == 404:
            return None, None
        headers = dict((k.lower(), v) for k, v in headers.items())
        doc = json.loads(body.decode("utf-8"))
        if not isinstance(doc, dict):
            raise ValueError("the manifest of %s:%s is not a JSON object" % (repository, tag))
        return headers.get("docker-content-digest"), doc

    def labels(self, repository, manifest):
        """The image's config labels (the linux/amd64 image of an index)."""
        scope = "repository:%s:pull" % repository
        if manifest.get("mediaType") in INDEX_TYPES or "manifests" in manifest:
            chosen = pick_platform(manifest.get("manifests") or [])
            if chosen is None:
                return {}
            status, _h, body = self.request("GET", "%s/manifests/%s" % (repository, chosen), MANIFEST_TYPES, scope)
            if status == 404:
                return {}
            manifest = json.loads(body.decode("utf-8"))
        digest = (manifest.get("config") or {}).get("digest")
        if not digest:
            return {}
        status, _h, body = self.request("GET", "%s/blobs/%s" % (repository, digest), None, scope)
        if status == 404:
            return {}
        config = json.loads(body.decode("utf-8"))
        return dict(((config if isinstance(config, dict) else {}).get("config") or {}).get("Labels") or {})


def header(headers, name):
    """A response header's value, whatever the case of its name."""
    for key, value in (headers or {}).items():
        if key.lower() == name.lower():
            return value
    return None


def pick_platform(manifests, arch="amd64"):
    """The digest of an index's ``linux/<arch>`` image, else its first."""
    for entry in manifests:
        platform = entry.get("platform") or {}
        if platform.get("os") == "linux" and platform.get("architecture") == arch:
            return entry.get("digest")
    return manifests[0].get("digest") if manifests else None


def _reason(exc):
    reason = getattr(exc, "reason", None) or exc
    return str(reason).splitlines()[0][:200] if str(reason) else type(reason).__name__


def inspect(ref, auth_file=None, insecure=False, labels=True, opener=None, env=None, home=None, timeout=10,
            token_hosts=()):
    """What the registry says of ``ref``: ``registry``, ``repository``, ``tag``, ``reachable``, ``credentials``
    (the auth file had some), ``exists``, ``digest``, ``labels``, ``error`` (``kind``: unreachable, credentials,
    error) and ``message`` (what is wrong, with the fix) -- the credentials themselves never."""
    parsed = parse_reference(ref)
    out = {"image": ref, "registry": None, "repository": None, "tag": None, "reachable": False,
           "credentials": False, "exists": False, "digest": None, "labels": {}, "error": None, "message": None}
    if parsed is None:
        out.update(error="reference", message="%r is not an image reference (registry/name:tag)" % (ref,))
        return out
    registry, repository, tag = parsed
    out.update(registry=registry, repository=repository, tag=tag)
    user, password, _path = credentials(registry, auth_file, env, home)
    out["credentials"] = user is not None
    reg = Registry(registry, insecure=insecure, user=user, password=password, opener=opener, timeout=timeout,
                   token_hosts=token_hosts)
    try:
        reg.ping()
        out["reachable"] = True
        digest, manifest = reg.manifest(repository, tag)
        if manifest is not None:
            out.update(exists=True, digest=digest)
            if labels:
                out["labels"] = reg.labels(repository, manifest)
    except RegistryError as exc:
        out.update(error=exc.kind, message=problem_text(exc.kind, str(exc), registry, auth_file, insecure))
        out["reachable"] = exc.kind != "unreachable"
    except ValueError as exc:
        out.update(reachable=True, error="error",
                   message="the registry %s answered something that is not JSON: %s" % (registry, exc))
    return out


def problem_text(kind, detail, registry, auth_file, insecure):
    """One sentence with the fix, for a registry that cannot be used."""
    where = auth_file or "the containers auth file (${XDG_RUNTIME_DIR}/containers/auth.json, " \
                         "~/.config/containers/auth.json or ~/.docker/config.json)"
    if kind == "unreachable":
        fix = ("start it, or check image_registry=%s (host:port)" % registry
               + ("" if insecure else "; a registry without TLS also needs -e image_registry_insecure=true"))
        return "the registry %s cannot be reached: %s. Fix: %s" % (registry, detail, fix)
    if kind == "credentials":
        return ("the registry %s needs credentials: %s. Fix: podman login %s (it writes %s), or -e "
                "image_auth_file=<an auth file that has them>" % (registry, detail, registry, where))
    return "the registry %s cannot be used: %s" % (registry, detail)
