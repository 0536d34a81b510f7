"""Tensor and file encodings behind a registry; see `mgit.codecs.base` for the contract."""

from mgit.codecs.base import (
    Codec,
    CodecContext,
    CodecError,
    byte_view,
    chain_from_list,
    chain_to_list,
    codec_from_dict,
    decode_chain,
    encode_chain,
)
from mgit.codecs.byteplanes import ByteplanesCodec
from mgit.codecs.delta import SubDeltaCodec, XorDeltaCodec
from mgit.codecs.zstd import ZstdCodec

__all__ = [
    "ByteplanesCodec",
    "Codec",
    "CodecContext",
    "CodecError",
    "SubDeltaCodec",
    "XorDeltaCodec",
    "ZstdCodec",
    "byte_view",
    "chain_from_list",
    "chain_to_list",
    "codec_from_dict",
    "decode_chain",
    "encode_chain",
]
