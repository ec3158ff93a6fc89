"""The registry client (provision/registry.py) against answers recorded from Debian's docker-registry 2.8 (a pushed
stack image's manifest and config, a token-auth registry's 401): references, the auth file, Basic and Bearer, a
tag that is missing, labels; and that credentials never leave the request headers."""
import base64
import io
import json
from pathlib import Path
from urllib.error import HTTPError, URLError
from urllib.parse import parse_qs, urlsplit

import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.provision import registry

FIX = Path(__file__).resolve().parents[4] / "fixtures" / "image"
MANIFEST = (FIX / "manifest.json").read_bytes()
CONFIG = (FIX / "config.json").read_bytes()
DIGEST = "sha256:d41c643ed2f38dbd506d57dc9bb69d182e0290b22a9b5d9a91bcf670a0a2d7ff"
REF = "127.0.0.1:5000/multinode-deepspeed:d312f27811669737"


def recorded_headers(name):
    lines = (FIX / name).read_text().splitlines()[1:]
    return dict(line.split(": ", 1) for line in lines if ": " in line)


class Answer(object):
    def __init__(self, code, body=b"", headers=None):
        self.code, self.body, self.headers = code, body, headers or {}

    def getcode(self):
        return self.code

    def read(self):
        return self.body


class Opener(object):
    """A registry: ``routes`` maps (method, url) to an Answer, an HTTPError code, or an exception."""

    def __init__(self, routes, auth=None):
        self.routes, self.auth, self.seen = routes, auth, []

    def open(self, req, timeout=None):
        method, url = req.get_method(), req.full_url
        self.seen.append((method, url, dict(req.header_items())))
        if self.auth and not url.endswith("/token") and req.get_header("Authorization") != self.auth:
            raise HTTPError(url, 401, "Unauthorized", {"WWW-Authenticate": 'Basic realm="basic-realm"'}, io.BytesIO())
        answer = self.routes.get((method, url.split("?")[0]))
        origin = "/".join(url.split("/")[:3]) + "/"
        if answer is None and not any(u.startswith(origin) for _m, u in self.routes):
            raise URLError("[SSL: WRONG_VERSION_NUMBER] wrong version number")
        if answer is None:
            raise HTTPError(url, 404, "Not Found", {}, io.BytesIO())
        if isinstance(answer, Exception):
            raise answer
        if isinstance(answer, int):
            hdrs = recorded_headers("silly_401.headers") if answer == 401 else {}
            raise HTTPError(url, answer, "error", hdrs, io.BytesIO())
        return answer


def image_routes(scheme="https"):
    base = "%s://127.0.0.1:5000/v2/" % scheme
    config = json.loads(MANIFEST)["config"]["digest"]
    return {("GET", base): Answer(200, b"{}"),
            ("GET", base + "multinode-deepspeed/manifests/d312f27811669737"): Answer(
                200, MANIFEST, recorded_headers("manifest.headers")),
            ("GET", base + "multinode-deepspeed/blobs/" + config): Answer(200, CONFIG)}


def auth_file(tmp_path, host, user="ci", password="s3cret-pw"):
    path = tmp_path / "auth.json"
    token = base64.b64encode(("%s:%s" % (user, password)).encode()).decode()
    path.write_text(json.dumps({"auths": {host: {"auth": token}}}))
    return str(path)


@pytest.mark.parametrize("ref, want", [
    (REF, ("127.0.0.1:5000", "multinode-deepspeed", "d312f27811669737")),
    ("registry.example.org/team/mnds:abc", ("registry.example.org", "team/mnds", "abc")),
    ("localhost/mnds-node:provisioned", ("localhost", "mnds-node", "provisioned")),
    ("mnds-node:local", ("docker.io", "library/mnds-node", "local")),
    ("team/mnds", ("docker.io", "team/mnds", "latest")),
    ("Bad Ref", None), ("reg:5000/x@sha256:abc", None), ("", None),
])
def test_references(ref, want):
    assert registry.parse_reference(ref) == want


def test_credentials_come_from_the_first_auth_file_that_names_the_registry(tmp_path):
    env = {"REGISTRY_AUTH_FILE": str(tmp_path / "missing.json"), "XDG_RUNTIME_DIR": str(tmp_path / "run")}
    home = tmp_path / "home"
    (home / ".config" / "containers").mkdir(parents=True)
    (home / ".config" / "containers" / "auth.json").write_text(json.dumps({"auths": {"other:5000": {"auth": "eDp5"}}}))
    (home / ".docker").mkdir()
    (home / ".docker" / "config.json").write_text(json.dumps(
        {"auths": {"https://127.0.0.1:5000": {"auth": base64.b64encode(b"u:p:w").decode()}}}))
    user, password, path = registry.credentials("127.0.0.1:5000", env=env, home=str(home))
    assert (user, password) == ("u", "p:w") and path.endswith(".docker/config.json")
    assert registry.credentials("nowhere:1", env=env, home=str(home)) == (None, None, None)
    assert registry.auth_file_candidates(env, str(home))[:2] == [env["REGISTRY_AUTH_FILE"],
                                                                 str(tmp_path / "run" / "containers" / "auth.json")]


def test_a_pushed_image_is_found_with_its_stack_label(tmp_path):
    opener = Opener(image_routes("http"))
    out = registry.inspect(REF, insecure=True, opener=opener, env={}, home=str(tmp_path))
    assert out["reachable"] and out["exists"] and out["error"] is None, out
    assert out["digest"] == DIGEST
    assert out["labels"][registry.FINGERPRINT_LABEL] == "d312f27811669737"
    # insecure: https first (the answer to it is a connection error here), then plain HTTP.
    assert [u for _m, u, _h in opener.seen][:1] == ["https://127.0.0.1:5000/v2/"]


def test_a_missing_tag_is_not_an_error(tmp_path):
    out = registry.inspect("127.0.0.1:5000/multinode-deepspeed:0000000000000000", opener=Opener(image_routes()),
                           env={}, home=str(tmp_path))
    assert out["reachable"] and not out["exists"] and out["error"] is None and out["labels"] == {}


def test_an_unreachable_registry_names_the_fix(tmp_path):
    refused = URLError(ConnectionRefusedError(111, "Connection refused"))
    opener = Opener({("GET", "https://127.0.0.1:5999/v2/"): refused})
    out = registry.inspect("127.0.0.1:5999/multinode-deepspeed", opener=opener, env={}, home=str(tmp_path))
    assert out["error"] == "unreachable" and not out["reachable"]
    assert "cannot be reached" in out["message"] and "image_registry_insecure=true" in out["message"]


def test_a_registry_that_wants_a_token_and_has_no_credentials_says_podman_login(tmp_path):
    opener = Opener({("GET", "http://127.0.0.1:5001/v2/"): 401, ("GET", "https://127.0.0.1:5001/v2/"): URLError("tls")})
    out = registry.inspect("127.0.0.1:5001/multinode-deepspeed", insecure=True, opener=opener, env={},
                           home=str(tmp_path))
    assert out["error"] == "credentials" and out["reachable"] and not out["credentials"], out
    assert "podman login 127.0.0.1:5001" in out["message"]
    assert "http://127.0.0.1:5001/token" in out["message"]


def test_basic_credentials_are_sent_and_never_returned(tmp_path):
    path = auth_file(tmp_path, "127.0.0.1:5000")
    expected = "Basic " + base64.b64encode(b"ci:s3cret-pw").decode()
    opener = Opener(image_routes(), auth=expected)
    out = registry.inspect(REF, auth_file=path, opener=opener)
    assert out["exists"] and out["credentials"] and out["error"] is None, out
    assert "s3cret-pw" not in json.dumps(out) and expected not in json.dumps(out)
    assert opener.seen[-1][2].get("Authorization") == expected


def test_wrong_basic_credentials_are_refused(tmp_path):
    path = auth_file(tmp_path, "127.0.0.1:5000", password="wrong")
    out = registry.inspect(REF, auth_file=path, opener=Opener(image_routes(), auth="Basic other"))
    assert out["error"] == "credentials" and "refuses the credentials for 127.0.0.1:5000" in out["message"]


def test_a_bearer_token_is_fetched_with_the_credentials_and_used(tmp_path):
    path = auth_file(tmp_path, "127.0.0.1:5001")
    routes = image_routes()
    routes = dict((("GET", u.replace("5000", "5001")), a) for (_m, u), a in routes.items())
    routes[("GET", "http://127.0.0.1:5001/v2/")] = Answer(200, b"{}")

    class TokenOpener(Opener):
        """docker-registry with token auth: the token service hands out a token per scope; /v2/ takes any token,
        a repository's paths only the token of its pull scope."""

        def open(self, req, timeout=None):
            url = req.full_url
            self.seen.append((req.get_method(), url, dict(req.header_items())))
            if url.startswith("http://127.0.0.1:5001/token"):
                scope = parse_qs(urlsplit(url).query).get("scope", [""])[0]
                return Answer(200, json.dumps({"token": "tok-" + scope}).encode())
            got = req.get_header("Authorization") or ""
            need = "Bearer tok-" if url.endswith("/v2/") else "Bearer tok-repository:multinode-deepspeed:pull"
            if not (got.startswith(need) if url.endswith("/v2/") else got == need):
                raise HTTPError(url, 401, "Unauthorized", recorded_headers("silly_401.headers"), io.BytesIO())
            self.seen.pop()
            return Opener.open(self, req, timeout)

    opener = TokenOpener(routes)
    out = registry.inspect("127.0.0.1:5001/multinode-deepspeed:d312f27811669737", auth_file=path, opener=opener,
                           insecure=True)
    assert out["exists"] and out["labels"][registry.FINGERPRINT_LABEL] == "d312f27811669737", out
    token_calls = [(u, h) for _m, u, h in opener.seen if "/token" in u]
    assert token_calls and "service=mnds-test" in token_calls[0][0]
    assert "scope=repository%3Amultinode-deepspeed%3Apull" in token_calls[-1][0]
    assert token_calls[0][1]["Authorization"].startswith("Basic ")


def test_an_index_picks_the_linux_amd64_image():
    index = {"manifests": [{"digest": "sha256:arm", "platform": {"os": "linux", "architecture": "arm64"}},
                           {"digest": "sha256:amd", "platform": {"os": "linux", "architecture": "amd64"}}]}
    assert registry.pick_platform(index["manifests"]) == "sha256:amd"
    assert registry.pick_platform(index["manifests"][:1]) == "sha256:arm"
    assert registry.pick_platform([]) is None


@pytest.mark.parametrize("reg, fingerprints, want, problem", [
    ("127.0.0.1:5000", {"w1": "d312f27811669737", "w2": "d312f27811669737"},
     "127.0.0.1:5000/multinode-deepspeed:d312f27811669737", None),
    ("", {"w1": "a"}, None, "image_registry is not set either"),
    ("bad registry", {"w1": "a"}, None, "is not a registry"),
    ("r:1", {"w1": "a", "w2": None}, None, "the stack of w2 is unknown"),
    ("r:1", {"w1": "a", "w2": "b"}, None, "different stacks (w1: a, w2: b)"),
])
def test_the_stack_image_is_the_rank_nodes_fingerprint(reg, fingerprints, want, problem):
    ref, why = registry.stack_image(reg, "multinode-deepspeed", fingerprints, "/opt/v")
    assert ref == want
    assert (why is None) if problem is None else (problem in why), why


def test_credentials_never_go_to_a_token_service_over_plain_http(tmp_path):
    path = auth_file(tmp_path, "127.0.0.1:5001")
    routes = {("GET", "https://127.0.0.1:5001/v2/"): 401}
    opener = Opener(routes)
    out = registry.inspect("127.0.0.1:5001/multinode-deepspeed", auth_file=path, opener=opener)
    assert out["error"] == "credentials" and "is not HTTPS" in out["message"], out
    assert not [u for _m, u, _h in opener.seen if "/token" in u]


def test_credentials_are_not_sent_on_to_where_a_redirect_points(tmp_path):
    reg = registry.Registry("127.0.0.1:5000", user="ci", password="pw", opener=Opener(image_routes()))
    reg.auth = reg._basic()  # pylint: disable=protected-access
    reg.request("GET", "")
    sent = reg.opener.seen[-1]
    assert sent[2]["Authorization"].startswith("Basic ")

    class Keep(Opener):
        def open(self, req, timeout=None):
            self.req = req
            return Opener.open(self, req, timeout)
    keep = Keep(image_routes())
    reg = registry.Registry("127.0.0.1:5000", opener=keep)
    reg.auth = "Bearer t"
    reg.request("GET", "")
    assert "Authorization" in keep.req.unredirected_hdrs and "Authorization" not in keep.req.headers


def test_a_server_that_is_not_a_registry_is_named(tmp_path):
    opener = Opener({("GET", "https://example.org/other"): Answer(200)})
    out = registry.inspect("example.org/multinode-deepspeed:1", opener=opener, env={}, home=str(tmp_path))
    assert out["error"] == "error" and "not an OCI registry" in out["message"], out


def test_docker_hub_is_read_at_its_api_host(tmp_path):
    opener = Opener({("GET", "https://registry-1.docker.io/v2/"): Answer(200, b"{}")})
    out = registry.inspect("library/busybox:1", opener=opener, env={}, home=str(tmp_path))
    assert out["reachable"] and not out["exists"], out
    assert opener.seen[0][1] == "https://registry-1.docker.io/v2/"


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://127.0.0.1/x", "data:text/plain,secret",
                                 "http://127.0.0.1:9/v2/"])
def test_the_registry_opener_speaks_https_only(url):
    """Issue 44, point 11: urllib's default opener also follows file:, ftp: and data: addresses (a 401's realm could
    name one); the registry's opener has no handler for them, nor for plain HTTP unless insecure."""
    with pytest.raises(URLError, match="unknown url type"):
        registry.make_opener().open(url, timeout=1)

    def schemes(opener):
        return set(s for s in ("file", "ftp", "data", "http", "https")
                   if any(hasattr(h, s + "_open") for h in opener.handlers))
    assert schemes(registry.make_opener()) == {"https"}
    assert schemes(registry.make_opener(insecure=True)) == {"https", "http"}


def test_a_redirect_to_another_scheme_is_refused():
    handler = [h for h in registry.make_opener().handlers if isinstance(h, registry._Redirects)][0]  # pylint: disable=protected-access
    req = registry.Request("https://127.0.0.1:5000/v2/x/blobs/sha256:1")
    with pytest.raises(HTTPError, match="refusing a redirect to http"):
        handler.redirect_request(req, None, 307, "moved", {}, "http://127.0.0.1:5000/blob")
    assert handler.redirect_request(req, None, 307, "moved", {}, "https://blobs.example.org/b").full_url \
        == "https://blobs.example.org/b"


@pytest.mark.parametrize("realm, host, token_hosts, problem", [
    ("https://127.0.0.1:5001/token", "127.0.0.1:5001", (), None),
    ("https://auth.docker.io/token", "docker.io", (), None),
    ("https://ghcr.io/token", "ghcr.io", (), None),
    ("https://evil.example.org/token", "127.0.0.1:5001", (), "on another host (evil.example.org)"),
    ("https://auth.example.org/token", "registry.example.org", ("auth.example.org",), None),
    ("file:///etc/passwd", "127.0.0.1:5001", (), "is not an https:// address"),
    ("ftp://127.0.0.1:5001/token", "127.0.0.1:5001", (), "is not an https:// address"),
])
def test_a_token_service_is_asked_only_on_the_registrys_host_unless_named(realm, host, token_hosts, problem):
    found = registry.realm_problem(realm, host, token_hosts=token_hosts)
    assert (found is None) if problem is None else (problem in found), found


def test_credentials_never_go_to_a_token_service_on_another_host(tmp_path):
    path = auth_file(tmp_path, "127.0.0.1:5001")
    challenge = 'Bearer realm="https://evil.example.org/token",service="x"'

    class Challenging(Opener):
        def open(self, req, timeout=None):
            self.seen.append((req.get_method(), req.full_url, dict(req.header_items())))
            raise HTTPError(req.full_url, 401, "Unauthorized", {"WWW-Authenticate": challenge}, io.BytesIO())
    opener = Challenging({})
    out = registry.inspect("127.0.0.1:5001/multinode-deepspeed", auth_file=path, opener=opener)
    assert out["error"] == "error" and "image_registry_token_hosts" in out["message"], out
    assert not [u for _m, u, _h in opener.seen if "evil" in u]
    ok = registry.inspect("127.0.0.1:5001/multinode-deepspeed", auth_file=path, opener=Challenging({}),
                          token_hosts=["evil.example.org"])
    assert "image_registry_token_hosts" not in (ok["message"] or ""), ok
