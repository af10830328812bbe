"""TileLang rewrites Python functions' AST into IR, and its lowering does so inside our compile threads; CPython 3.11
keeps the AST converters' recursion depth in interpreter-wide state, so two threads parsing at once failed a CI run
("AST constructor recursion depth mismatch"). ``lowering.compile`` makes those rewrites take turns."""

import threading
import time

import tilelang.language.eager.ast as tl_ast
import tilelang.language.eager.builder as tl_builder

from tilefuse.lowering import compile as compile_mod


def test_tilelangs_ast_rewrite_is_serialized_wherever_it_is_called_from():
    assert tl_builder.mutate._tilefuse_serial and tl_ast.mutate._tilefuse_serial
    assert compile_mod._one_at_a_time(tl_builder.mutate) is tl_builder.mutate  # (installed once)


def test_serialized_calls_never_overlap_and_pass_results_and_errors_through():
    inside, most, lock = [0], [0], threading.Lock()

    def probe(x):
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.002)
        with lock:
            inside[0] -= 1
        if x < 0:
            raise ValueError(x)
        return x * 2

    serial = compile_mod._one_at_a_time(probe)
    results, errors = [], []

    def work(k):
        for x in (k, -1):
            try:
                results.append(serial(x))
            except ValueError as e:
                errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1 and sorted(results) == [2 * k for k in range(8)] and len(errors) == 8
