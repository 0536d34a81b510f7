"""Tensor and file encodings behind a registry; see `mgit.codecs.base` for the contract."""

from mgit.codecs.base import (
    Codec,
    CodecContext,
    CodecError,
    blockwise,
    byte_array,
    byte_view,
    chain_from_list,
    chain_to_list,
    codec_class,
    codec_from_dict,
    decode_chain,
    decoded_bound,
    encode_chain,
    storage_of,
    writable,
)
from mgit.codecs.byteplanes import ByteplanesCodec
from mgit.codecs.delta import SubDeltaCodec, XorDeltaCodec
from mgit.codecs.derived import (
    AbsmaxScaleCodec,
    CastCodec,
    LowRankCodec,
    PatchCodec,
    QuantizeInt8Codec,
    TransposeCodec,
)
from mgit.codecs.fp8 import Fp8CastCodec
from mgit.codecs.lora import LoraMergeCodec
from mgit.codecs.merged import WeightedSumCodec
from mgit.codecs.pco import PcoCodec
from mgit.codecs.quantized_delta import QuantizedDeltaCodec
from mgit.codecs.requantize import REQUANTIZABLE, RequantizeCodec
from mgit.codecs.zstd import ZstdCodec

__all__ = [
    "WeightedSumCodec",
    "AbsmaxScaleCodec",
    "CastCodec",
    "Fp8CastCodec",
    "PatchCodec",
    "PcoCodec",
    "QuantizedDeltaCodec",
    "QuantizeInt8Codec",
    "REQUANTIZABLE",
    "RequantizeCodec",
    "ByteplanesCodec",
    "Codec",
    "CodecContext",
    "CodecError",
    "LoraMergeCodec",
    "LowRankCodec",
    "SubDeltaCodec",
    "TransposeCodec",
    "XorDeltaCodec",
    "ZstdCodec",
    "blockwise",
    "byte_array",
    "byte_view",
    "chain_from_list",
    "chain_to_list",
    "codec_class",
    "codec_from_dict",
    "decode_chain",
    "decoded_bound",
    "encode_chain",
    "storage_of",
    "writable",
]
