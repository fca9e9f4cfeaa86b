"""Every public function of llama.h / mtmd.h / mtmd-helper.h is bound (or excluded with a reason),
with the header's argument count and types; the generated modules are up to date."""

from __future__ import annotations

import pytest

from build_tools.bindgen import generate as bindgen
from build_tools.bindgen import headers as H

from .conftest import binding_modules

PUBLIC = {"llama.h": "llama_cpp", "mtmd.h": "mtmd_cpp", "mtmd-helper.h": "mtmd_cpp", "llama-ext.h": "llama_cpp"}


def _bindings() -> dict[str, object]:
    out: dict[str, object] = {}
    for mod in binding_modules():
        out.update(mod.__bindings__.functions)
    return out


def signature_problems(fn, decl: H.Function, rules: H.TypeRules) -> list[str]:
    return H.function_problems(fn.argtypes, fn.restype, decl, rules)


@pytest.mark.parametrize("header", sorted(PUBLIC))
def test_every_public_function_is_bound_or_excluded(api, header):
    bound = _bindings()
    declared = api.functions_in(header)
    assert declared, header
    missing = [f.name for f in declared if f.name not in bound and f.name not in bindgen.EXCLUDED]
    assert not missing, f"{header}: not bound and not excluded: {missing}"
    for reason in bindgen.EXCLUDED.values():
        assert reason and len(reason) > 10


def test_function_counts(api):
    bound = _bindings()
    llama = [f for f in api.functions_in("llama.h")]
    assert len(llama) == 255
    assert sum(1 for f in llama if f.deprecated) == 36
    assert all(bound[f.name].deprecated == f.deprecated for f in llama)
    assert len(api.functions_in("mtmd.h")) + len(api.functions_in("mtmd-helper.h")) == 84


def test_signatures_match_the_headers(api, rules):
    problems = []
    bound = _bindings()
    for name, fn in bound.items():
        decl = api.functions.get(name)
        if decl is None:
            problems.append(f"{name}: bound but not declared in the headers")
            continue
        problems += signature_problems(fn, decl, rules)
    assert not problems, "\n".join(problems)


def test_signature_check_catches_a_wrong_binding(api, rules):
    import ctypes

    from llama_cpp._native.ctypes_util import CFunction

    decl = api.functions["llama_batch_ext_set_pos"]
    wrong = CFunction("llama_batch_ext_set_pos", "llama", [ctypes.c_void_p, ctypes.c_int64,
                                                            ctypes.POINTER(ctypes.c_int32)], ctypes.c_bool)
    assert signature_problems(wrong, decl, rules) == [
        "llama_batch_ext_set_pos arg 1 (idx): ctypes i64 != header int32_t (i32)"]
    short = CFunction("llama_batch_ext_set_pos", "llama", [ctypes.c_void_p], ctypes.c_bool)
    assert "1 argtypes, header has 3" in signature_problems(short, decl, rules)[0]


def test_mtp_api_is_bound():
    from llama_cpp import llama_cpp as C

    names = ["llama_batch_ext_init", "llama_batch_ext_free", "llama_batch_ext_clear", "llama_batch_ext_add",
             "llama_batch_ext_add_token", "llama_batch_ext_add_embd", "llama_batch_ext_add_seq",
             "llama_batch_ext_set_embd_token", "llama_batch_ext_set_embd_state", "llama_batch_ext_set_output_embd",
             "llama_batch_ext_set_output_logits", "llama_batch_ext_set_pos", "llama_process", "llama_memory_seq_rm",
             "llama_state_seq_get_size_ext", "llama_state_seq_get_data_ext", "llama_state_seq_set_data_ext",
             "llama_model_n_layer_nextn"]
    for n in names:
        assert n in C.__bindings__.functions and not C.__bindings__.functions[n].optional, n
    optional = {"llama_set_embeddings_nextn", "llama_get_embeddings_nextn", "llama_get_embeddings_nextn_ith",
                "llama_set_nextn_layer_offset", "llama_get_ctx_other", "llama_set_embeddings_layer_inp",
                "llama_get_embeddings_layer_inp"}
    stubs = {f.__name__: f for f in C.__bindings__.optionals()}  # the registry: module attributes get swapped
    assert optional <= set(stubs)
    assert stubs["llama_set_embeddings_nextn"].symbols[0] == "_Z26llama_set_embeddings_nextnP13llama_contextbb"
    assert stubs["llama_get_embeddings_nextn_ith"].symbols[0] == "_Z30llama_get_embeddings_nextn_ithP13llama_contexti"
    assert stubs["llama_set_embeddings_nextn"].symbols[1].startswith("?llama_set_embeddings_nextn@@")
    assert {"ctx_type", "n_rs_seq", "ctx_other"} <= {f[0] for f in C.llama_context_params._fields_}
    assert "load_mtp" in {f[0] for f in C.llama_model_params._fields_}


def test_generated_modules_are_up_to_date(api):
    generated = bindgen.generate_all(api)
    stale = [name for name, text in generated.items()
             if (bindgen.PKG / f"{name}.py").read_text() != text]
    assert not stale, f"run `python -m build_tools.bindgen`: stale {stale}"


def test_itanium_mangling_substitutions(api):
    # const char * twice -> S3_ (candidates: 11llama_vocab, K.., PK.., Kc, PKc)
    decl = H.Function("llama_grammar_init_impl", H.VOID, (
        ("vocab", H.CType("ptr", to=H.CType("struct", "llama_vocab", const=True))),
        ("a", H.CType("ptr", to=H.CType("name", "char", const=True))),
        ("b", H.CType("ptr", to=H.CType("name", "char", const=True))),
        ("c", H.CType("name", "_Bool")),
    ), False, "x", 0)
    assert bindgen.itanium_name(api, decl) == "_Z23llama_grammar_init_implPK11llama_vocabPKcS3_b"
    no_args = H.Function("f", H.VOID, (), False, "x", 0)
    assert bindgen.itanium_name(api, no_args) == "_Z1fv"
    assert bindgen.msvc_name(api, no_args) == "?f@@YAXXZ"
