"""torch.compile with a graph-counting backend in place of inductor: the graphs Dynamo makes are what any backend is
handed, so a test counts them (recompiles, graph breaks) without inductor's minutes of code generation."""
from __future__ import annotations

import torch


def counting_compile(monkeypatch) -> tuple[list[torch.fx.GraphModule], list[dict]]:
    """Module.compile with a graph-counting backend in place of inductor: (the graphs Dynamo hands it, each call's
    module and arguments)."""
    graphs: list[torch.fx.GraphModule] = []
    compile_calls: list[dict] = []

    def counting_backend(graph: torch.fx.GraphModule, example_inputs):
        graphs.append(graph)
        return graph.forward

    original = torch.nn.Module.compile

    def compile_counting(self, *args, **kwargs):
        compile_calls.append({"module": type(self).__name__, **kwargs})
        original(self, fullgraph=kwargs["fullgraph"], dynamic=kwargs["dynamic"], backend=counting_backend)

    monkeypatch.setattr(torch.nn.Module, "compile", compile_counting)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    return graphs, compile_calls
