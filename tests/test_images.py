"""Image embedding (CLIP): both towers against transformers on the same folder through every
backend, images from a local HTTP server and as data URIs, the real clients' image calls,
every bad-media case as a 400 naming the input, and SSRF refusals."""

from __future__ import annotations

import base64
import io
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
from conftest import cosines, serve_in_process, spec_of

from infinity_cloud import Engine, ModelSpec
from infinity_cloud.core.config import LimitsSpec
from infinity_cloud.engine.asks import EmbedAsk
from infinity_cloud.media.fetch import AccessPolicy, is_public

TEXTS = ["a photo of a cat", "a diagram of the water cycle", "red"]


@pytest.fixture(scope="session")
def clip(build_model: Callable[..., Path]) -> Path:
    return build_model("clip")


@pytest.fixture(scope="session")
def siglip(build_model: Callable[..., Path]) -> Path:
    return build_model("clip", model_type="siglip")


def picture(width: int, height: int, seed: int, fmt: str = "PNG") -> bytes:
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width] / max(width, height)
    pixels = np.stack([x, y, rng.random((height, width))], axis=-1) * 255
    buffer = io.BytesIO()
    Image.fromarray(pixels.astype(np.uint8)).save(buffer, format=fmt)
    return buffer.getvalue()


# Non-square, larger and smaller than the model's 32 pixels, and a JPEG: resize and crop matter.
PICTURES = {
    "wide.png": picture(60, 40, 1), "tall.png": picture(33, 90, 2), "square.jpg": picture(32, 32, 3, "JPEG"),
}


def data_uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def reference(path: Path, texts: list[str], images: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """transformers' model with its own tokenizer and (PIL) image processor, normalised:
    CLIP pads to the longest text with a mask; SigLIP, as its processor does, to its full
    length, ids only."""
    import torch
    from PIL import Image
    from transformers import (
        AutoConfig,
        AutoModel,
        AutoTokenizer,
        CLIPImageProcessorPil,
        SiglipImageProcessorPil,
    )

    siglip = AutoConfig.from_pretrained(str(path)).model_type == "siglip"
    model = AutoModel.from_pretrained(str(path)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    if siglip:
        tokens = tokenizer(texts or ["-"], padding="max_length", max_length=64, return_tensors="pt")
        tokens = {"input_ids": tokens["input_ids"]}
    else:
        tokens = tokenizer(texts or ["-"], padding=True, return_tensors="pt")
    processor = SiglipImageProcessorPil if siglip else CLIPImageProcessorPil
    pictures = [Image.open(io.BytesIO(b)) for b in images]
    pixels = processor.from_pretrained(str(path))(pictures, return_tensors="pt")
    with torch.no_grad():
        text = model.get_text_features(**tokens).pooler_output.numpy()
        image = model.get_image_features(**pixels).pooler_output.numpy()
    return unit(text), unit(image)


def unit(rows: np.ndarray) -> np.ndarray:
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


async def embed_images(client, inputs: list[str], model: str = "clip"):
    return await client.post("/embeddings", json={"model": model, "input": inputs, "modality": "image"})


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        name = self.path.lstrip("/")
        if name in PICTURES:
            return self._send(200, PICTURES[name], "image/png")
        if name.startswith("redirect/"):
            self.send_response(302)
            self.send_header("Location", "http://" + name.removeprefix("redirect/"))
            self.end_headers()
            return None
        if name == "slow.png":
            time.sleep(2)
            return self._send(200, PICTURES["wide.png"], "image/png")
        if name == "big.png":
            return self._send(200, b"\0" * 300_000, "image/png")
        if name.startswith("huge"):
            return self._send(200, b"\0" * 8_000_000, "image/png")
        if name == "text.png":
            return self._send(200, b"this is not a picture", "image/png")
        if name == "tiny.png":
            return self._send(200, picture(4, 4, 5), "image/png")
        return self._send(404, b"no such picture", "text/plain")

    def _send(self, status: int, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        pass  # the fetcher hangs up on slow and over-large answers, as it should


@pytest.fixture(scope="module")
def pictures_host() -> Iterator[str]:
    """A local picture server on 127.0.0.1 (allow-listed by the tests that fetch from it)."""
    server = _Server(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.mark.parametrize("kind", ["clip", "siglip"])
@pytest.mark.parametrize("backend", ["torch", "onnx", "openvino"])
async def test_both_towers_match_transformers(request: pytest.FixtureRequest, kind: str, backend: str):
    path = request.getfixturevalue(kind)
    images = list(PICTURES.values())
    want_text, want_image = reference(path, TEXTS, images)
    async with Engine(ModelSpec(model_id=str(path), backend=backend, dtype="float32")) as engine:
        text = await engine.embeddings(EmbedAsk(TEXTS))
        image = await engine.embeddings(EmbedAsk([data_uri(b) for b in images], modality="image"))
        facts = engine.describe()[0]
    assert facts["modalities"] == ["text", "image"] and facts["dimensions"] == want_text.shape[1]
    assert cosines(text.embeddings, want_text).min() > 0.999
    assert cosines(image.embeddings, want_image).min() > 0.999
    # Each image is nearest its own reference: a wrong crop or channel order would not be.
    assert (np.argmax(image.embeddings @ want_image.T, axis=1) == np.arange(len(images))).all()
    # Each image costs its patches (and CLIP's class token).
    assert image.prompt_tokens == len(images) * ((32 // 8) ** 2 + (kind == "clip"))


@pytest.mark.parametrize("kind", ["clip", "siglip"])
async def test_images_by_url_and_data_uri_in_one_request(
    request: pytest.FixtureRequest, kind: str, pictures_host: str
) -> None:
    """Served as users would (auto backend, over HTTP): URLs fetched from a local server
    (allow-listed), data URIs decoded, answered in input order; base64 works too."""
    path = request.getfixturevalue(kind)
    names = ["tall.png", "wide.png", "square.jpg", "wide.png"]
    inputs = [f"http://{pictures_host}/{n}" for n in names[:2]] + [data_uri(PICTURES[n]) for n in names[2:]]
    want_text, want = reference(path, TEXTS, [PICTURES[n] for n in names])
    allowed = {"media_allowed_hosts": ["127.0.0.1"]}
    spec = spec_of(ModelSpec(model_id=str(path), served_model_name="clip"), limits=allowed)
    async with serve_in_process(spec) as client:
        response = await embed_images(client, inputs)
        assert response.status_code == 200, response.text
        packed = await client.post(
            "/embeddings_image", json={"model": "clip", "input": inputs[2], "encoding_format": "base64"}
        )
        assert packed.status_code == 200, packed.text
        text = await client.post("/embeddings", json={"model": "clip", "input": TEXTS})
        assert text.status_code == 200
    got = np.array([d["embedding"] for d in response.json()["data"]], dtype=np.float32)
    assert [d["index"] for d in response.json()["data"]] == [0, 1, 2, 3]
    assert cosines(got, want).min() > 0.999
    texts = np.array([d["embedding"] for d in text.json()["data"]], dtype=np.float32)
    assert cosines(texts, want_text).min() > 0.999
    np.testing.assert_allclose(np.frombuffer(base64.b64decode(packed.json()["data"][0]["embedding"]), "<f4"),
                               got[2], atol=1e-6)


async def test_the_real_clients_embed_images(clip: Path) -> None:
    """infinity_client's image call and the openai SDK (base64, the modality in extra_body)."""
    import httpx
    from infinity_client import Client
    from infinity_client.api.default import embeddings_image
    from infinity_client.models import OpenAIEmbeddingInputImage
    from openai import AsyncOpenAI

    _, want = reference(clip, [], [PICTURES["wide.png"]])
    uri = data_uri(PICTURES["wide.png"])
    async with serve_in_process(spec_of(ModelSpec(model_id=str(clip), served_model_name="clip"))) as client:
        transport = client._transport
        sdk = AsyncOpenAI(api_key="x", base_url="http://testserver/v1", http_client=httpx.AsyncClient(
            transport=transport, base_url="http://testserver/v1"))
        by_openai = await sdk.embeddings.create(model="clip", input=[uri], extra_body={"modality": "image"})
        infinity = Client(base_url="http://testserver")
        infinity.set_async_httpx_client(httpx.AsyncClient(transport=transport, base_url="http://testserver"))
        by_infinity = await embeddings_image.asyncio(
            client=infinity, body=OpenAIEmbeddingInputImage(input_=[uri], model="clip")
        )
    assert cosines(np.array([by_openai.data[0].embedding]), want)[0] > 0.999
    assert cosines(np.array([by_infinity.data[0].embedding]), want)[0] > 0.999


async def test_bad_media_is_a_400_naming_the_input(clip: Path, tiny_embedder: Path, pictures_host: str):
    limits = {"limits": {
        "media_allowed_hosts": ["127.0.0.1"], "media_timeout_s": 0.5, "media_max_bytes": 200_000,
        "max_media_per_request": 4,
    }}
    spec = spec_of(
        ModelSpec(model_id=str(clip), served_model_name="clip"),
        ModelSpec(model_id=str(tiny_embedder), served_model_name="text"), **limits,
    )
    good = data_uri(PICTURES["wide.png"])
    url = f"http://{pictures_host}"
    cases = [
        ([good, f"{url}/missing.png"], "input 1", "HTTP 404"),
        ([f"{url}/text.png"], "input 0", "not an image that can be decoded (PNG, JPEG"),
        ([good, f"{url}/text.png"], "input 1", "it is text"),  # what the bytes are, in words
        ([good, data_uri(PICTURES["wide.png"][:200])], "input 1", "PNG image whose pixels cannot be decoded"),
        ([good, good, "data:image/png;base64,@@@"], "input 2", "base64"),
        ([f"{url}/tiny.png"], "input 0", "at least 8 pixels"),
        ([f"{url}/slow.png"], "input 0", "longer than 0.5s"),
        ([f"{url}/big.png"], "input 0", "larger than the 200,000 bytes"),
        (["a cat.png"], "input 0", "http(s) URL or a data"),
        (["ftp://example.com/a.png"], "input 0", "http(s) URL or a data"),
        ([good] * 5, "5 media items", "limit of 4"),
        (["http://unresolvable.invalid/a.png"], "input 0", "cannot resolve"),
    ]
    async with serve_in_process(spec) as client:
        for inputs, where, what in cases:
            started = time.monotonic()
            response = await embed_images(client, inputs)
            assert response.status_code in (400, 413), (inputs[-1][:60], response.text)
            assert where in response.text and what in response.text, (inputs[-1][:60], response.text)
            assert "BytesIO" not in response.text, response.text  # the decoder's name for its file
            assert time.monotonic() - started < 5
        for body, what in [
            ({"model": "text", "input": [good], "modality": "image"}, "reads text;"),
            ({"model": "clip", "input": [good], "modality": "audio"}, "reads text and image"),
            ({"model": "clip", "input": [[1, 2, 3]], "modality": "image"}, "URL or a data"),
        ]:
            response = await client.post("/embeddings", json=body)
            assert response.status_code == 400 and what in response.text, response.text
        assert (await embed_images(client, [good])).status_code == 200  # the server is still fine


@pytest.mark.parametrize("address", [
    "127.0.0.1", "10.1.2.3", "172.16.0.9", "192.168.1.1", "169.254.169.254", "100.64.0.1", "0.0.0.0",
    "::1", "fe80::1", "fd00:ec2::254", "::ffff:127.0.0.1", "::ffff:169.254.169.254", "224.0.0.1", "ff02::1",
])
def test_non_public_addresses_are_refused(address: str) -> None:
    import ipaddress

    assert not is_public(ipaddress.ip_address(address))


# Every IPv6 form that carries an IPv4 address, judged by that address; ranges never public.
EMBEDDED = [
    ("64:ff9b::a9fe:a9fe", False),  # NAT64 (well-known prefix) to 169.254.169.254: the metadata service
    ("64:ff9b::7f00:1", False),  # NAT64 to 127.0.0.1
    ("64:ff9b::808:808", True),  # NAT64 to 8.8.8.8
    ("64:ff9b:1::a9fe:a9fe", False),  # NAT64 for local use (RFC 8215)
    ("2002:7f00:1::", False),  # 6to4 of 127.0.0.1
    ("2002:a9fe:a9fe::1", False),  # 6to4 of 169.254.169.254
    ("2002:0a00:0001::", False),  # 6to4 of 10.0.0.1
    ("2002:808:808::", True),  # 6to4 of 8.8.8.8
    ("::127.0.0.1", False),  # IPv4-compatible (deprecated)
    ("::169.254.169.254", False),
    ("::8.8.8.8", True),
    ("::ffff:10.0.0.1", False),  # IPv4-mapped
    ("::ffff:0:127.0.0.1", False),  # SIIT IPv4-translated (::ffff:0:0:0/96)
    ("::ffff:0:169.254.169.254", False),
    ("::ffff:0:10.0.0.1", False),
    ("::ffff:0:8.8.8.8", True),
    ("2001:0:4136:e378:8000:63bf:3fff:fdd2", False),  # Teredo
    ("fec0::1", False),  # site-local (deprecated)
    ("2606:4700:4700::1111", True),  # a public IPv6 address
]


@pytest.mark.parametrize(("address", "public"), EMBEDDED)
def test_ipv6_forms_that_carry_an_ipv4_address_are_judged_by_it(address: str, public: bool) -> None:
    import ipaddress

    assert is_public(ipaddress.ip_address(address)) is public


async def test_urls_httpx_cannot_read_are_a_400_naming_the_input(clip: Path) -> None:
    async with serve_in_process(spec_of(ModelSpec(model_id=str(clip), served_model_name="clip"))) as client:
        for url in ("http://0177.0.0.1/a.png", "http://127.000.000.001/a.png"):
            response = await embed_images(client, [url])
            assert response.status_code == 400, (url, response.text)
            assert "input 0" in response.text and "not a valid URL" in response.text, response.text


def test_the_allow_list_takes_names_addresses_and_networks() -> None:
    import ipaddress

    from infinity_cloud.media.fetch import MediaRefused

    policy = AccessPolicy(["images.internal", "10.0.0.0/8", "::1"])
    policy.check("images.internal", [ipaddress.ip_address("192.168.0.5")])
    policy.check("files", [ipaddress.ip_address("10.9.8.7"), ipaddress.ip_address("::1")])
    policy.check("example.com", [ipaddress.ip_address("93.184.215.14")])
    with pytest.raises(MediaRefused, match=r"192\.168\.0\.5"):
        policy.check("files", [ipaddress.ip_address("10.9.8.7"), ipaddress.ip_address("192.168.0.5")])


async def test_fetched_media_bytes_are_held_from_the_memory_budget(clip: Path, pictures_host: str) -> None:
    """A small request naming many large URLs holds their bytes as they arrive: past the memory
    budget it is refused (it used to download them all, 1.85 GB for 64 URLs of 20 MiB, while
    the budget saw nothing), and what it held is given back."""
    from infinity_cloud.admission.memory import MB
    from infinity_cloud.engine import Engine

    engine = Engine(spec_of(ModelSpec(model_id=str(clip), served_model_name="clip"),
                            limits=LimitsSpec(media_allowed_hosts=("127.0.0.1",))))
    async with serve_in_process(engine) as client:
        memory = engine.memory  # 160 MB for requests on the idle server, once loaded
        memory.limit_bytes = (memory.limit_bytes or 0) + 160 * MB - (memory.room_for_requests() or 0)
        urls = [f"http://{pictures_host}/huge-{i}.png" for i in range(48)]  # 384 MB for a 2 KB body
        response = await embed_images(client, urls)
        assert response.status_code in (413, 429), response.text
        assert "memory budget" in response.text, response.text
        one = await embed_images(client, urls[:1])  # fetched, then not a picture: a 400 naming it
        assert one.status_code == 400 and "input 0" in one.text, one.text
        metrics = (await client.get("/metrics")).text
        assert "infinity_cloud_memory_held_bytes 0.0" in metrics


async def test_fetched_bytes_that_fit_are_counted_once(clip: Path, pictures_host: str) -> None:
    """A request whose downloads fit what an idle server holds is served whole: each byte is
    counted once, though it is both resident and held (issue 50, N2: 20 URLs of 20 MB under a
    1,200 MB budget were a 429 'retry shortly' after about 16 downloads, every time)."""
    from infinity_cloud.admission.memory import MB
    from infinity_cloud.engine import Engine

    engine = Engine(spec_of(ModelSpec(model_id=str(clip), served_model_name="clip"),
                            limits=LimitsSpec(media_allowed_hosts=("127.0.0.1",))))
    async with serve_in_process(engine) as client:
        memory = engine.memory  # 300 MB for requests on the idle server
        memory.limit_bytes = (memory.limit_bytes or 0) + 300 * MB - (memory.room_for_requests() or 0)
        urls = [f"http://{pictures_host}/huge-{i}.png" for i in range(20)]  # 160 MB, 80 MB estimated
        response = await embed_images(client, urls)
        # Fetched whole, then read: the server's zero bytes are not a picture (a 400 naming it).
        assert response.status_code == 400 and "input 0" in response.text, response.text
        assert memory.held_bytes == 0


async def test_ssrf_is_refused_unless_allow_listed(clip: Path, pictures_host: str) -> None:
    """Loopback by address and by a name resolving to it, metadata and private addresses,
    and a redirect from an allowed host to a refused one: all 400, nothing fetched; the
    same picture with its host allow-listed works."""
    port = pictures_host.split(":")[1]
    refused = [
        f"http://127.0.0.1:{port}/wide.png",
        f"http://localhost:{port}/wide.png",
        f"http://[::1]:{port}/wide.png",
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.1/a.png",
        f"http://[::ffff:127.0.0.1]:{port}/wide.png",
    ]
    # localhost is allowed by name; the redirect it answers leads to 127.0.0.1, which is not.
    bounced = f"http://localhost:{port}/redirect/127.0.0.1:{port}/wide.png"
    spec = spec_of(ModelSpec(model_id=str(clip), served_model_name="clip"),
                   limits=LimitsSpec(media_timeout_s=2))
    allowed_by_name = spec_of(ModelSpec(model_id=str(clip), served_model_name="clip"),
                              limits=LimitsSpec(media_allowed_hosts=("localhost",)))
    async with serve_in_process(spec) as client:
        for url in refused:
            response = await embed_images(client, [url])
            assert response.status_code == 400, (url, response.text)
            assert "refused" in response.text and "non-public" in response.text, (url, response.text)
    async with serve_in_process(allowed_by_name) as client:
        ok = await embed_images(client, [f"http://localhost:{port}/wide.png"])
        assert ok.status_code == 200, ok.text
        response = await embed_images(client, [bounced])
        assert response.status_code == 400, response.text
        assert "127.0.0.1" in response.text and "refused" in response.text, response.text
