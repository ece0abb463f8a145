"""Model codec: bit-exact round trips and every rejection."""

from __future__ import annotations

import pytest
import torch

from flmesh.format import codec
from flmesh.format.codec import CodecError, ModelMeta, decode, encode, model_spec
from flmesh.format.compression import WireFormat
from flmesh.format.digests import DIGEST_BYTES, DIGESTS, new_digest
from flmesh.format.frames import parse_chunk
from flmesh.v1 import model_pb2 as pb


def sample_state(nan: bool = False) -> dict[str, torch.Tensor]:
    """Tensors of every wire dtype; with ``nan``, one of NaN, Inf and -0.0 (receivers refuse
    NaN and Inf unless told not to)."""
    g = torch.Generator().manual_seed(1)
    state = {
        "w": torch.randn(7, 5, generator=g),
        "b": torch.randn(5, generator=g, dtype=torch.float64),
        "half": torch.randn(3, 3, generator=g).half(),
        "bf": torch.randn(4, generator=g).to(torch.bfloat16),
        "steps": torch.tensor(12345678901, dtype=torch.int64),  # 0-d, like BN's num_batches_tracked
        "mask": torch.tensor([True, False, True]),
        "i8": torch.tensor([-3, 4], dtype=torch.int8),
        "empty": torch.zeros(0, 4),
    }
    if nan:
        state["nan"] = torch.tensor([float("nan"), float("inf"), -0.0])
    return state


def chunks_of(state, chunk_bytes=13, **meta):
    return list(encode(state, ModelMeta(**meta)).chunks(chunk_bytes))


@pytest.mark.parametrize("chunk_bytes", [1, 13, 64, 1 << 20])
def test_round_trip_is_bit_exact(chunk_bytes):
    state = sample_state(nan=True)
    meta = ModelMeta(round=4, sender="node1", kind="trained", num_samples=99,
                     label_counts=(3, 0, 5), architecture="mlp", metadata={"k": "v"})
    out = decode(encode(state, meta).chunks(chunk_bytes), model_spec(state), check_finite=False)
    assert list(out.state_dict) == list(state)
    for name, tensor in state.items():
        got = out.state_dict[name]
        assert got.dtype == tensor.dtype and got.shape == tensor.shape
        # Compare raw bytes: bit-exact, NaN payloads and -0.0 included.
        assert got.reshape(-1).view(torch.uint8).tolist() == tensor.reshape(-1).view(torch.uint8).tolist()
    assert out.meta == meta


def test_nan_or_inf_weights_are_refused_by_default():
    state = sample_state(nan=True)
    with pytest.raises(CodecError, match="tensor 'nan' holds 2 NaN or infinite values") as err:
        decode(encode(state).chunks(), model_spec(state))
    assert err.value.code == "INVALID_ARGUMENT"
    del state["nan"]
    assert decode(encode(state).chunks(), model_spec(state)).state_dict.keys() == state.keys()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_finite_check_sees_every_nan_and_infinity_and_lets_huge_finite_values_through(dtype):
    """The check sums first: a sum that overflows (huge but finite weights) must still pass, and
    one NaN, +inf or -inf anywhere (also +inf with -inf, whose sum is NaN) must not."""
    big = torch.finfo(dtype).max
    huge = {"w": torch.full((1000,), big, dtype=dtype)}
    assert torch.isinf(huge["w"].sum()), "the test needs a sum that overflows"
    assert decode(encode(huge).chunks(), model_spec(huge)).state_dict["w"].equal(huge["w"])
    for bad, count in (([float("nan")], 1), ([float("inf")], 1), ([-float("inf")], 1),
                       ([float("inf"), -float("inf")], 2)):
        state = {"w": torch.ones(5000, dtype=dtype)}
        state["w"][[4999 - i * 1777 for i in range(len(bad))]] = torch.tensor(bad, dtype=dtype)
        with pytest.raises(CodecError, match=f"tensor 'w' holds {count} NaN or infinite values"):
            decode(encode(state).chunks(), model_spec(state))


def test_padding_beyond_alignment_is_refused():
    """A header may not announce more bytes than its tensors fill (plus alignment): a padded
    payload would make the receiver hold memory the model does not need."""
    state = {"w": torch.zeros(3)}
    good = encode(state)
    padded = pb.ModelHeader()
    padded.CopyFrom(good.header)
    padded.total_bytes = good.total_bytes + 10 * 2**20
    with pytest.raises(CodecError, match="announces 10485772 payload bytes, its tensors fill 12"):
        decode([pb.ModelChunk(header=padded)], model_spec(state))
    gap = pb.ModelHeader()
    gap.CopyFrom(good.header)
    gap.tensors[0].offset = 128
    gap.total_bytes = 140
    with pytest.raises(CodecError, match="starts 128 bytes after the previous one"):
        decode([pb.ModelChunk(header=gap)], model_spec(state))


def test_chunks_respect_the_size_limit():
    state = {"w": torch.zeros(1000)}
    chunks = chunks_of(state, chunk_bytes=256)
    assert chunks[0].WhichOneof("payload") == "header"
    assert all(len(c.data) <= 256 for c in chunks[1:])
    assert sum(len(c.data) for c in chunks[1:]) == chunks[0].header.total_bytes


def test_model_from_a_gpu_or_noncontiguous_view_encodes():
    base = torch.arange(12.0).reshape(3, 4)
    state = {"t": base.t()}  # non-contiguous
    out = decode(encode(state).chunks(), model_spec(state))
    assert torch.equal(out.state_dict["t"], base.t())


@pytest.mark.parametrize("digest", ["xxh3_128", "blake3", "sha256"])
def test_corrupt_bytes_are_rejected(digest):
    chunks = list(encode(sample_state(), wire=WireFormat(digest=digest)).chunks(13))
    assert len(getattr(chunks[0].header, digest)) == DIGEST_BYTES[digest]
    assert [name for name in DIGESTS if getattr(chunks[0].header, name)] == [digest]
    assert decode(chunks, model_spec(sample_state())).total_bytes == chunks[0].header.total_bytes
    data = bytearray(chunks[2].data)
    data[0] ^= 0xFF
    chunks[2] = pb.ModelChunk(data=bytes(data))
    with pytest.raises(CodecError, match=f"{digest} of the received bytes does not match") as err:
        decode(chunks, model_spec(sample_state()))
    assert err.value.reason == "corrupt"


def test_a_header_carries_exactly_one_digest_of_its_size():
    chunks = chunks_of(sample_state())
    assert len(chunks[0].header.xxh3_128) == 16, "XXH3-128 is the default"
    cases = {"two": {"sha256": b"\0" * 32}, "three": {"sha256": b"\0" * 32, "blake3": b"\0" * 32},
             "neither": {"xxh3_128": b""}, "short": {"xxh3_128": b"\0" * 15},
             "long": {"xxh3_128": b"", "blake3": b"\0" * 33}}
    messages = {"two": r"more than one digest \(xxh3_128, sha256",
                "three": r"more than one digest \(xxh3_128, blake3, sha256",
                "neither": "carries no digest", "short": "header xxh3_128 must be 16 bytes",
                "long": "header blake3 must be 32 bytes"}
    for case, fields in cases.items():
        header = pb.ModelHeader()
        header.CopyFrom(chunks[0].header)
        for name, value in fields.items():
            setattr(header, name, value)
        with pytest.raises(CodecError, match=messages[case]) as err:
            decode([pb.ModelChunk(header=header), *chunks[1:]], model_spec(sample_state()))
        assert err.value.reason == "corrupt"
    with pytest.raises(ValueError, match="unknown digest 'md5'"):
        encode(sample_state(), wire=WireFormat(digest="md5"))


def test_truncated_and_overlong_streams_are_rejected():
    state = sample_state()
    chunks = chunks_of(state)
    with pytest.raises(CodecError, match="ended after") as err:
        decode(chunks[:-1], model_spec(state))
    assert err.value.reason == "corrupt"
    with pytest.raises(CodecError, match="more than the") as err:
        decode([*chunks, pb.ModelChunk(data=b"x")], model_spec(state))
    assert err.value.reason == "corrupt"


def test_stream_must_start_with_one_header():
    chunks = chunks_of(sample_state())
    with pytest.raises(CodecError, match="start with a model header"):
        decode(chunks[1:])
    with pytest.raises(CodecError, match="second header"):
        decode([chunks[0], chunks[0]])
    with pytest.raises(CodecError, match="start with a model header"):
        decode([])


def test_oversize_is_rejected_before_reading_bytes():
    state = {"w": torch.zeros(1024)}  # 4096 bytes

    def stream():
        yield from chunks_of(state)[:1]
        raise AssertionError("the decoder read past the header of an oversize model")

    with pytest.raises(CodecError, match="exceeds the limit of 1000 bytes") as err:
        decode(stream(), model_spec(state), max_bytes=1000)
    assert err.value.reason == "oversize"


@pytest.mark.parametrize(
    ("local", "message"),
    [
        ({"w": torch.zeros(7, 6)}, "tensor 'w': shape [7, 5] does not match the local [7, 6]"),
        ({"w": torch.zeros(7, 5, dtype=torch.float64)},
         "tensor 'w': dtype float32 does not match the local float64"),
        ({"v": torch.zeros(7, 5)}, "unknown tensor 'w'"),
        ({"w": torch.zeros(7, 5), "extra": torch.zeros(1)}, "tensor 'extra' is missing"),
    ],
    ids=["wrong-shape", "wrong-dtype", "unknown-tensor", "missing-tensor"],
)
def test_mismatch_with_the_local_model_is_rejected(local, message):
    sent = {"w": torch.zeros(7, 5)}
    with pytest.raises(CodecError, match=message.replace("[", r"\[").replace("]", r"\]")) as err:
        decode(chunks_of(sent), model_spec(local))
    assert err.value.reason == "mismatch"


def test_inconsistent_header_is_rejected():
    chunks = chunks_of({"w": torch.zeros(4)})
    header = pb.ModelHeader()
    header.CopyFrom(chunks[0].header)
    header.tensors[0].nbytes = 8
    with pytest.raises(CodecError, match="8 bytes for shape") as err:
        decode([pb.ModelChunk(header=header), *chunks[1:]])
    assert err.value.reason == "corrupt"
    header.CopyFrom(chunks[0].header)
    header.tensors[0].dtype = 99
    with pytest.raises(CodecError, match="unknown dtype #99"):
        decode([pb.ModelChunk(header=header), *chunks[1:]])


def test_unknown_kind_and_dtype_cannot_be_encoded():
    with pytest.raises(ValueError, match="unknown model kind"):
        encode({"w": torch.zeros(1)}, ModelMeta(kind="bogus"))
    with pytest.raises(ValueError, match="cannot be sent"):
        encode({"w": torch.zeros(1, dtype=torch.complex64)})


def test_payload_offsets_are_aligned():
    header = encode(sample_state()).header
    assert all(t.offset % codec.ALIGN == 0 for t in header.tensors)


@pytest.mark.parametrize("bad", [None, float("nan"), float("-inf")])
def test_a_sender_that_packs_tensors_unaligned_is_decoded_by_copy_and_checked(bad):
    """Another encoder may pack tensors back to back: a float tensor at an odd offset cannot be
    a view of the buffer, so it is copied once, shaped, and checked for NaN and infinity."""
    w = torch.arange(6.0).reshape(2, 3)
    if bad is not None:
        w[1, 2] = bad
    tag = torch.tensor([7, 8, 9], dtype=torch.uint8)
    payload = tag.numpy().tobytes() + w.numpy().tobytes()
    digest = new_digest("xxh3_128")
    digest.update(payload)
    header = pb.ModelHeader(total_bytes=len(payload), kind=pb.MODEL_KIND_TRAINED, xxh3_128=digest.digest(),
                            tensors=[pb.TensorSpec(name="tag", dtype=codec.TO_WIRE[torch.uint8], shape=[3],
                                                   offset=0, nbytes=3),
                                     pb.TensorSpec(name="w", dtype=codec.TO_WIRE[torch.float32], shape=[2, 3],
                                                   offset=3, nbytes=24)])
    chunks = [pb.ModelChunk(header=header), pb.ModelChunk(data=payload)]
    spec = model_spec({"tag": tag, "w": w})
    if bad is not None:
        with pytest.raises(CodecError, match="tensor 'w' holds 1 NaN or infinite values"):
            decode(chunks, spec)
        return
    out = decode(chunks, spec).state_dict
    assert torch.equal(out["w"], w) and torch.equal(out["tag"], tag)


@pytest.mark.parametrize("kind", [pb.MODEL_KIND_UNSPECIFIED, 42])
def test_unknown_or_unspecified_kind_is_refused_as_invalid(kind):
    chunks = chunks_of({"w": torch.zeros(4)})
    header = pb.ModelHeader()
    header.CopyFrom(chunks[0].header)
    header.kind = kind
    with pytest.raises(CodecError, match="is not one a node accepts") as err:
        decode([pb.ModelChunk(header=header), *chunks[1:]])
    assert err.value.reason == "invalid" and err.value.code == "INVALID_ARGUMENT"


def test_typed_metadata_round_trips():
    meta = ModelMeta(round=3, sender="a", kind="extras",
                     metadata={"algorithm": "fedcurv", "n": 7, "x": 0.5, "flag": True})
    out = decode(encode({"w": torch.zeros(2)}, meta).chunks())
    assert out.meta.metadata == {"algorithm": "fedcurv", "n": 7, "x": 0.5, "flag": True}
    assert isinstance(out.meta.metadata["flag"], bool) and isinstance(out.meta.metadata["n"], int)
    with pytest.raises(ValueError, match="metadata 'bad'"):
        encode({"w": torch.zeros(2)}, ModelMeta(metadata={"bad": [1, 2]}))


@pytest.mark.parametrize("chunk_bytes", [1, 100, 1 << 20])
@pytest.mark.parametrize("field", [None, 2])
def test_frames_are_byte_equal_to_serialised_chunks(chunk_bytes, field):
    from flmesh.v1 import peer_pb2

    message = encode(sample_state(), ModelMeta(round=2, sender="n", metadata={"k": "v"}))
    frames = list(message.frames(chunk_bytes, field=field))
    if field is None:
        expected = [c.SerializeToString() for c in message.chunks(chunk_bytes)]
    else:
        expected = [peer_pb2.TrainRequest(chunk=c).SerializeToString() for c in message.chunks(chunk_bytes)]
    assert frames == expected
    serialised = [c.SerializeToString() for c in message.chunks(chunk_bytes)]
    assert message.wire_bytes(chunk_bytes) == sum(map(len, serialised))
    assert decode([parse_chunk(f) for f in message.frames(chunk_bytes)]).wire_bytes == \
        message.wire_bytes(chunk_bytes)


def test_every_received_model_owns_its_tensors():
    """Decoding the same stream twice gives two models that share no memory: writing into one
    (training starts from it in place) leaves the other as it came."""
    state = sample_state()
    message = encode(state)
    first = decode(message.chunks(5), model_spec(state)).state_dict
    second = decode(message.chunks(5), model_spec(state)).state_dict
    for name, tensor in first.items():
        tensor.zero_()
        assert torch.equal(second[name], state[name]), name


def test_wire_formats_round_trip_zstd_exactly_and_float16_within_its_precision():
    from flmesh.format.compression import WireFormat

    state = sample_state()
    spec = model_spec(state)
    zstd = WireFormat(compression="zstd")
    packed = encode(state, ModelMeta(), zstd)
    assert packed.header.compression == pb.COMPRESSION_ZSTD and packed.compressed is not None
    out = decode(packed.chunks(7), spec, wire=zstd)
    assert all(torch.equal(out.state_dict[k], v) for k, v in state.items())
    half = WireFormat(dtype=torch.float16, compression="zstd")
    small = encode(state, ModelMeta(), half)
    assert small.wire_bytes() < encode(state).wire_bytes()
    got = decode(small.chunks(), spec, wire=half)
    assert got.state_dict["w"].dtype == torch.float32, "cast back to the receiver's own dtype"
    assert torch.allclose(got.state_dict["w"], state["w"], atol=1e-2)
    assert torch.equal(got.state_dict["steps"], state["steps"]), "integers travel as they are"
    with pytest.raises(CodecError, match="dtype float16 does not match the local float32"):
        decode(small.chunks(), spec)  # a receiver not told about the wire dtype refuses it


def test_a_compressed_stream_cannot_expand_past_its_header_or_be_garbage():
    import zstandard

    state = {"w": torch.zeros(16)}
    good = encode(state)
    header = pb.ModelHeader()
    header.CopyFrom(good.header)
    header.compression = pb.COMPRESSION_ZSTD
    bomb = zstandard.ZstdCompressor().compress(b"\0" * (64 << 20))  # 64 MiB of zeros, a few KiB sent
    with pytest.raises(CodecError, match="holds more than the 64 bytes its header announced"):
        decode([pb.ModelChunk(header=header), pb.ModelChunk(data=bomb)], model_spec(state))
    with pytest.raises(CodecError, match="does not decompress"):
        decode([pb.ModelChunk(header=header), pb.ModelChunk(data=b"not zstd at all")], model_spec(state))
    header.compression = 7
    with pytest.raises(CodecError, match="unknown compression #7"):
        decode([pb.ModelChunk(header=header)], model_spec(state))
