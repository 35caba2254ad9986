"""`ProgramExecutor`: runs the steps appended to one program state, in order.

`s += expr` only queues the steps, so a program keeps running Python while the model
works, and the forks of one state generate concurrently (the runtime batches them). A
worker thread is started when steps are queued and exits when the queue is empty, so an
idle state holds no thread. Reads (`s["x"]`, `s.text()`) call `sync()`, which waits for
the queue to drain.

After a step fails, the remaining steps are dropped, the error is kept, and `sync()`
raises it in the program's thread.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

from radixgen.backends.base import Backend, Prompt
from radixgen.errors import StateClosedError, UnsupportedFeatureError
from radixgen.ir import Gen, Primitive, RoleBegin, RoleEnd, Select, Text
from radixgen.runtime.request_schema import build_request
from radixgen.text_stream import TextStream
from radixgen.transcript import Transcript


@dataclass(frozen=True)
class SetVariable:
    """`s[name] = value` (or a fork join), queued so it lands in order with the steps
    before it."""

    name: str
    value: Any
    meta_info: Any = None


Step = Primitive | SetVariable


class ProgramExecutor:
    def __init__(
        self,
        backend: Backend,
        defaults: dict[str, Any],
        *,
        stream: bool,
        transcript: Transcript | None = None,
        variables: dict[str, Any] | None = None,
        meta_infos: dict[str, dict[str, Any]] | None = None,
    ):
        self.backend = backend
        self.defaults = defaults
        self.stream = stream
        self.transcript = transcript or Transcript()
        self.variables: dict[str, Any] = dict(variables or {})
        self.meta_infos: dict[str, dict[str, Any]] = dict(meta_infos or {})
        self.assigned_names: set[str] = set()  # set by this executor (not inherited at fork)
        self.text_stream = TextStream()
        self.text_stream.append_text(self.transcript.text)
        self.error: BaseException | None = None
        self._pending: deque[Step] = deque()
        self._worker_running = False
        self._closed = False
        self._program_error: BaseException | None = None
        self._idle = threading.Condition()

    # ---- called from the program's thread ----

    def submit(self, step: Step) -> None:
        with self._idle:
            if self._closed:
                raise StateClosedError(
                    "this program has finished; append to a state only inside its "
                    "@rg.function (start a new run to continue)"
                )
            self._pending.append(step)
            if not self._worker_running:
                self._worker_running = True
                threading.Thread(target=self._drain, daemon=True).start()

    def wait_idle(self) -> None:
        """Waits until every queued step has run (or was dropped after an error)."""
        with self._idle:
            self._idle.wait_for(lambda: not self._worker_running)

    def sync(self) -> None:
        """Waits for the queue to drain; raises the error of a failed step, if any."""
        self.wait_idle()
        if self.error is not None:
            raise self.error

    def close(self, program_error: BaseException | None = None) -> None:
        """No more steps: once the queue drains, stream readers finish (raising a step's
        error, else `program_error`)."""
        with self._idle:
            self._closed = True
            self._program_error = program_error
            if not self._worker_running:
                self.text_stream.close(self.error or program_error)

    # ---- the worker thread ----

    def _drain(self) -> None:
        while True:
            with self._idle:
                if not self._pending:
                    self._worker_running = False
                    if self._closed:
                        self.text_stream.close(self.error or self._program_error)
                    self._idle.notify_all()
                    return
                step = self._pending.popleft()
            if self.error is not None:
                continue  # a failed step drops everything queued after it
            try:
                self._run_step(step)
            except Exception as error:  # kept, and re-raised by sync() in the program thread
                self.error = error

    def _run_step(self, step: Step) -> None:
        if isinstance(step, Text):
            self._emit(self.transcript.add_text(step.text))
        elif isinstance(step, RoleBegin):
            template = self.backend.chat_template()
            self._emit(self.transcript.begin_role(step.role, template))
        elif isinstance(step, RoleEnd):
            template = self.backend.chat_template()
            self._emit(self.transcript.end_role(step.role, template))
        elif isinstance(step, Gen):
            self._run_gen(step)
        elif isinstance(step, Select):
            self._run_select(step)
        elif isinstance(step, SetVariable):
            self._store(step.name, step.value, step.meta_info)
        else:
            raise TypeError(f"unknown program step {step!r}")

    def _emit(self, text: str, var_name: str | None = None) -> None:
        self.text_stream.append_text(text, var_name)

    def _run_gen(self, gen: Gen) -> None:
        transcript = self.transcript
        prompt = self._prompt()
        # The one request type, validated whole: the gen's own options over the run's.
        request = build_request({**self.defaults, **gen.options}, text=prompt.text)
        if self.stream:
            pieces: list[str] = []
            meta_info: dict[str, Any] = {}
            for delta in self.backend.generate_stream(prompt, request):
                pieces.append(transcript.add_text(delta.text))
                self._emit(delta.text, gen.name)
                if delta.meta_info is not None:
                    meta_info = delta.meta_info
            output_text = "".join(pieces)
        else:
            output = self.backend.generate(prompt, request)
            output_text, meta_info = output.text, output.meta_info
            self._emit(transcript.add_text(output_text), gen.name)
        value = _parse_tool_call(output_text) if gen.parses_tool_call else output_text
        self._store(gen.name, value, meta_info)

    def _run_select(self, select: Select) -> None:
        if self.defaults.get("lora_path") is not None:
            raise UnsupportedFeatureError(
                "rg.select scores choices with the base model only; under a LoRA adapter "
                "(the run's lora_path) use rg.gen(choices=[...]) instead"
            )
        outcome = self.backend.select(self._prompt(), list(select.choices), select.method)
        choice = select.choices[outcome.index]
        self._emit(self.transcript.add_text(choice), select.name)
        self._store(select.name, choice, outcome.meta_info)

    def _prompt(self) -> Prompt:
        transcript = self.transcript
        open_role = transcript.open_role.role if transcript.open_role else None
        return Prompt(transcript.text, transcript.messages_with_open(), open_role)

    def _store(self, name: str | None, value: Any, meta_info: Any) -> None:
        if name is None:
            return
        self.variables[name] = value
        if meta_info is not None:
            self.meta_infos[name] = meta_info
        self.assigned_names.add(name)
        self.text_stream.end_var(name)


def _parse_tool_call(text: str) -> dict[str, Any]:
    """rg.gen(tools=...)'s output -> {"name", "arguments"} (the constraint made it JSON)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise ValueError(
            f"the tool call was cut before it ended ({text[-40:]!r}): raise max_tokens, or keep "
            "constraint_budget on so that a cut call still ends complete"
        ) from None
