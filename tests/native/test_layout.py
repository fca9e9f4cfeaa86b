"""Struct layouts and constant values of the bindings against the C compiler's view of the headers."""

from __future__ import annotations

import ctypes

from .conftest import (
    Layout,
    bound_constants,
    compare_field_types,
    compare_layout,
    mirrored_classes,
    py_layout,
)


def test_every_mirrored_struct_matches_the_compiler(api, probe):
    from build_tools.bindgen.generate import mirrored_structs

    classes = {n: c for n, c in mirrored_classes().items() if api.structs[n].header != "llama-ext.h"}
    assert set(classes) == {n for n in mirrored_structs(api) if api.structs[n].header != "llama-ext.h"}
    assert set(probe.layouts) == set(classes)
    problems = [p for n, c in sorted(classes.items()) for p in compare_layout(n, py_layout(c), probe.layouts[n])]
    assert not problems, "\n".join(problems)


def test_staging_struct_matches_the_cxx_compiler(probe_ext):
    from llama_cpp.llama_cpp import llama_quant_model_desc

    assert not compare_layout("llama_quant_model_desc", py_layout(llama_quant_model_desc),
                              probe_ext.layouts["llama_quant_model_desc"])


def test_params_structs_have_the_documented_sizes(probe):
    from llama_cpp import llama_cpp as C
    from llama_cpp import mtmd_cpp as M

    for cls, size in ((C.llama_model_params, 80), (C.llama_context_params, 160), (C.llama_batch, 56),
                      (C.llama_embd, 24), (M.mtmd_context_params, 96)):
        name = cls._c_name_
        assert probe.layouts[name].size == size, name
        assert ctypes.sizeof(cls) == size, name
    assert probe.layouts["llama_context_params"].fields["ctx_type"][0] == 36
    assert probe.layouts["llama_context_params"].fields["ctx_other"][0] == 152
    assert C.llama_context_params.ctx_other.offset == 152
    assert "load_mtp" in probe.layouts["llama_model_params"].fields
    assert "n_rs_seq" in probe.layouts["llama_context_params"].fields


def test_field_names_order_and_types_follow_the_headers(api, rules):
    problems = []
    for name, cls in sorted(mirrored_classes().items()):
        problems += compare_field_types(cls, api.structs[name], rules)
    assert not problems, "\n".join(problems)


def test_every_enum_and_define_value_matches(api, probe):
    from .conftest import binding_modules

    ints, strs = bound_constants(api)
    assert len(ints) > 300
    assert set(ints) <= set(probe.ints)
    values = {}
    for mod in binding_modules():
        values.update({n: getattr(mod, n) for n in ints + strs if hasattr(mod, n)})
    wrong = [f"{n}: {values[n]} (python) != {probe.ints[n]} (C)" for n in ints if values[n] != probe.ints[n]]
    wrong += [f"{n}: {values[n]!r} != {probe.strings[n]!r}" for n in strs if values[n] != probe.strings[n]]
    assert not wrong, "\n".join(wrong)
    # every constant of llama.h/mtmd headers is bound
    want = set(api.enum_constants("llama.h", "mtmd.h", "mtmd-helper.h"))
    want |= {d.name for d in api.defines.values() if d.header in ("llama.h", "mtmd.h", "mtmd-helper.h")}
    assert want <= set(values), sorted(want - set(values))


def _perturbed(cls: type, field: str, new_type: type) -> type:
    fields = [(n, new_type if n == field else t) for n, t, *_ in cls._fields_]
    return type(f"{cls.__name__}_perturbed", (ctypes.Structure,), {"_c_name_": cls._c_name_, "_fields_": fields})


def test_a_perturbed_field_is_caught(api, probe, rules):
    from llama_cpp.llama_cpp import llama_context_params, llama_model_params

    # a wider field shifts every later member: layout comparison fails
    bad = _perturbed(llama_context_params, "n_batch", ctypes.c_uint64)
    problems = compare_layout("llama_context_params", py_layout(bad), probe.layouts["llama_context_params"])
    assert any("sizeof" in p for p in problems)
    assert any("n_ubatch" in p for p in problems)
    # a same-size but different type (float -> int) keeps the layout: the type check catches it
    same_size = _perturbed(llama_context_params, "rope_freq_base", ctypes.c_int32)
    assert not compare_layout("llama_context_params", py_layout(same_size), probe.layouts["llama_context_params"])
    problems = compare_field_types(same_size, api.structs["llama_context_params"], rules)
    assert problems and "rope_freq_base" in problems[0]
    # a dropped trailing bool changes nothing but the member list
    dropped = type("dropped", (ctypes.Structure,), {"_c_name_": "llama_model_params",
                                                     "_fields_": llama_model_params._fields_[:-1]})
    problems = compare_layout("llama_model_params", py_layout(dropped), probe.layouts["llama_model_params"])
    assert any("load_mtp" in p for p in problems)


def test_layout_compare_reports_alignment():
    a = Layout(8, 8, {"x": (0, 8)})
    b = Layout(8, 4, {"x": (0, 8)})
    assert compare_layout("s", a, b) == ["s: alignof 8 (ctypes) != 4 (C)"]
