"""Conformance: the official ONNX backend node suite (``onnx.backend.test``) through tilefuse.

Every node test runs through ``tilefuse.onnx_backend`` (ONNX import -> tilefuse graph ->
``compile_onnx`` -> registry ops with torch references); nothing is computed by onnxruntime or
onnx's reference evaluator. Tests of features tilefuse does not support are skipped by the explicit
``EXCLUDE`` table (regex -> reason); known bugs outside the frontend are expected failures
(``KNOWN_BUGS``); everything else must pass.

    pytest tests/test_onnx_backend_suite.py -n 2          # in CI
    python tests/test_onnx_backend_suite.py               # prints "ONNX node suite: N passed of 1884"
"""

from __future__ import annotations

import io
import re
import sys
import unittest
import warnings
from types import MappingProxyType

import onnx.backend.test
import torch

from tilefuse.onnx_backend import TilefuseBackend

BAR = 1000  # node tests that must pass (onnxruntime 1.32 passes 1588 of 1884 here)

_CONTROL_FLOW = "control flow (If/Loop/Scan) is not supported"
_SEQUENCE = "sequence / optional values are not supported"
_STRING = "string tensors have no torch dtype"
_SUBBYTE = "4-bit / 2-bit / float4 / float8e8m0 types have no torch dtype"
_RANDOM = "random ops (output depends on a random generator)"

EXCLUDE: dict[str, str] = {
    # control flow, directly or inside the ONNX function an op expands into
    r"^test_(if|loop\d*|scan\d*)(_|$)": _CONTROL_FLOW,
    r"^test_affine_grid_.*_expanded$": _CONTROL_FLOW + " (AffineGrid's function body uses If)",
    r"^test_range_.*_expanded$": _CONTROL_FLOW + " (Range's function body uses Loop)",
    r"^test_linear_attention_": _CONTROL_FLOW + " (LinearAttention's function body uses Scan)",
    # value kinds other than tensors
    r"^test_(sequence|split_to_sequence|optional)_": _SEQUENCE,
    r"^test_identity_(sequence|opt)$": _SEQUENCE,
    r"^test_(string_|strnormalizer|regex_full_match|equal_string)": _STRING,
    r"^test_ai_onnx_ml_label_encoder": _STRING + " (ai.onnx.ml LabelEncoder)",
    r"^test_(cast|castlike)_.*(INT4|INT2|FLOAT4E2M1|FLOAT8E8M0)": _SUBBYTE,
    r"^test_(de)?quantizelinear_(u?int4|u?int2|float4e2m1)$": _SUBBYTE,
    # domains and op families out of scope
    r"^test_ai_onnx_ml_": "ai.onnx.ml domain (classical ML ops) is not supported",
    r"^test_(adagrad|adam|momentum|nesterov_momentum)": "ai.onnx.preview.training domain is not supported",
    r"^test_image_decoder_": "ImageDecoder needs image codecs",
    r"^test_tfidfvectorizer_": "TfIdfVectorizer (n-gram text op) is not supported",
    r"^test_bernoulli": _RANDOM,
    r"^test_training_dropout": _RANDOM + " (Dropout in training mode)",
    # numerics of the expected outputs
    r"^test_dft_inverse(_opset19)?$": "expected output carries FFT rounding noise (1.9e-7) above atol=1e-7 "
                                      "where the exact value is 0",
    r"^test_attention_4d_causal_fp16(_expanded)?$": "1-ulp float16 difference: expected output computed in "
                                                    "higher precision than Attention's float16 function body",
    r"^test_attention_4d_fp16$": "2-ulp float16 difference the other way: the expected output is Attention's float16 "
                                 "arithmetic, tilefuse's one sdpa is closer to the exact result (max error 3.0e-4 "
                                 "against the expected output's 4.7e-4, computed in float64)",
}

# Known bugs of tilefuse outside the ONNX frontend: expected failures, so that the fix shows up as an
# unexpected success (a failure) and the entry gets removed.
KNOWN_BUGS: dict[str, str] = {}

_PATTERNS = {re.compile(p): reason for p, reason in EXCLUDE.items()}
_BUGS = {re.compile(p): reason for p, reason in KNOWN_BUGS.items()}


def exclusion(name: str) -> str | None:
    """The reason a node test (name without the _cpu/_cuda suffix) is excluded, or None."""
    return next((reason for p, reason in _PATTERNS.items() if p.search(name)), None)


class SuiteBackend(TilefuseBackend):
    """The backend as the suite runs it: the whole pipeline (import, planner) with the reference
    executor; kernels are compiled and checked by the lowering tests, not 1,884 times here."""

    compile_options = MappingProxyType({"lower": False})


def _node_tests() -> type[unittest.TestCase]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numpy overflow warnings while onnx builds its cases
        backend_test = onnx.backend.test.BackendTest(SuiteBackend, __name__)
    case = backend_test.test_cases["OnnxBackendNodeModelTest"]
    for attr in [a for a in vars(case) if a.startswith("test_")]:
        base, _, device = attr.rpartition("_")
        if device == "cuda" and not torch.cuda.is_available():
            delattr(case, attr)
            continue
        reason = exclusion(base)
        if reason:
            setattr(case, attr, unittest.skip(f"excluded: {reason}")(getattr(case, attr)))
        elif any(p.search(base) for p in _BUGS):
            setattr(case, attr, unittest.expectedFailure(getattr(case, attr)))
    return case


OnnxBackendNodeModelTest = _node_tests()


def node_test_names() -> list[str]:
    """Names of all node tests (without device suffix)."""
    return sorted({a.rpartition("_")[0] for a in vars(OnnxBackendNodeModelTest) if a.startswith("test_")})


def test_exclusions_are_live_and_leave_the_bar():
    """Every exclusion matches some test, and what is left (all of which must pass) clears the bar."""
    names = node_test_names()
    for pattern in (*_PATTERNS, *_BUGS):
        assert any(pattern.search(n) for n in names), f"stale exclusion {pattern.pattern!r}"
    included = [n for n in names if exclusion(n) is None and not any(p.search(n) for p in _BUGS)]
    print(f"ONNX node suite: {len(included)} included (each must pass) of {len(names)}")
    assert len(included) >= BAR


def main() -> int:
    """Run the CPU node tests in this process and print the pass count."""
    suite = unittest.TestSuite(OnnxBackendNodeModelTest(a) for a in sorted(vars(OnnxBackendNodeModelTest))
                               if a.startswith("test_") and a.endswith("_cpu"))
    result = unittest.TextTestRunner(stream=io.StringIO(), verbosity=0).run(suite)
    skipped, known = len(result.skipped), len(result.expectedFailures)
    failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
    passed = result.testsRun - skipped - failed - known
    reasons: dict[str, int] = {}
    for _, why in result.skipped:
        reasons[why] = reasons.get(why, 0) + 1
    for why, count in sorted(reasons.items(), key=lambda kv: -kv[1]):
        print(f"  skipped {count:4d}  {why}")
    print(f"  known bugs (expected failures) {known:4d}")
    for test, trace in result.failures + result.errors:
        print(f"  FAILED {test.id()}: {trace.strip().splitlines()[-1]}")
    for test in result.unexpectedSuccesses:
        print(f"  UNEXPECTED SUCCESS {test.id()}: remove its KNOWN_BUGS entry")
    print(f"ONNX node suite: {passed} passed of {result.testsRun}")
    return 0 if failed == 0 and passed >= BAR else 1


if __name__ == "__main__":
    sys.exit(main())
