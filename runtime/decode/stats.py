"""Statistics of one generation: acceptance, accepted length, speed, where the time went."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specx.runtime.decode.policy import StepResult


@dataclass
class Stats:
    prompt_tokens: int = 0
    # of them, kept from an earlier generation or copied from another batch row (runtime/prefix):
    # the prompt read only the rest
    reused_prompt_tokens: int = 0
    prompt_cache: str = ""  # where they came from: cache | store | row ("" where none)
    prompt_cache_note: str = ""  # why nothing was reused where something might have been
    new_tokens: int = 0
    k: int = 0  # the K asked for (0: target alone; max K if adaptive); may shrink near limits
    drafter: str = "none"
    adaptive: bool = False  # K chosen per step (-k auto)
    target_passes: int = 0  # target passes after prefill (each verifies up to K + 1 tokens)
    draft_passes: int = 0  # draft model passes (0 for a lookup drafter)
    proposed: int = 0  # draft tokens sent to verification
    accepted: int = 0  # draft tokens the target accepted
    rejections: int = 0  # steps whose proposal was cut short by a rejected token
    proposed_per_position: list[int] = field(default_factory=list)  # index i: draft token i + 1
    accepted_per_position: list[int] = field(default_factory=list)
    k_used: list[int] = field(default_factory=list)  # K of every step (adaptive K varies it)
    # target passes by their width, the tokens each verified (proposed + 1): with the measured
    # cost of a pass of each width, what the decode costs whatever the machine did meanwhile
    pass_widths: dict[int, int] = field(default_factory=dict)
    prefill_s: float = 0.0  # both models' prompt passes
    first_token_s: float = 0.0  # from the generation's start to its first committed token
    draft_s: float = 0.0  # proposing (draft passes or lookups)
    verify_s: float = 0.0  # target passes
    decode_s: float = 0.0  # wall time of the decode loop (draft + verify + overhead)
    stop_reason: str = ""  # eos | max_new_tokens | max_length | interrupted | grammar
    stop_detail: str = ""  # why, where the reason alone does not say (grammar: the matcher's error)

    def observe(self, step: StepResult) -> None:
        """Count one step: its pass, its proposal and acceptance, K, and where its time went."""
        self.target_passes += 1
        self.proposed += step.proposed
        self.accepted += step.accepted
        self.rejections += int(step.accepted < step.proposed)
        self.k_used.append(step.k)
        width = step.proposed + 1
        self.pass_widths[width] = self.pass_widths.get(width, 0) + 1
        while len(self.proposed_per_position) < step.proposed:
            self.proposed_per_position.append(0)
            self.accepted_per_position.append(0)
        for i in range(step.proposed):
            self.proposed_per_position[i] += 1
        for i in range(step.accepted):
            self.accepted_per_position[i] += 1
        self.draft_s += step.draft_s
        self.verify_s += step.verify_s
        self.draft_passes += step.draft_passes

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens / proposed draft tokens."""
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def alpha(self) -> float:
        """Per-token acceptance probability (Leviathan et al.'s alpha), maximum likelihood under
        their i.i.d. model: accepted / (accepted + rejections)."""
        trials = self.accepted + self.rejections
        return self.accepted / trials if trials else 0.0

    @property
    def tokens_per_pass(self) -> float:
        """Mean tokens committed per target pass (1 for the target alone)."""
        return self.new_tokens / self.target_passes if self.target_passes else 0.0

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.decode_s

    @property
    def tokens_per_s(self) -> float:
        """New tokens / (prefill + decode) wall time."""
        return self.new_tokens / self.total_s if self.total_s > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        return self.new_tokens / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def overhead_s(self) -> float:
        """Decode time spent outside model passes: verification, bookkeeping, detokenizing."""
        return max(0.0, self.decode_s - self.draft_s - self.verify_s)

    @property
    def mean_k(self) -> float:
        return sum(self.k_used) / len(self.k_used) if self.k_used else 0.0

    @property
    def acceptance_per_position(self) -> list[float]:
        return [
            a / p if p else 0.0
            for a, p in zip(self.accepted_per_position, self.proposed_per_position, strict=True)
        ]

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("k_used")
        data["pass_widths"] = {str(w): n for w, n in sorted(self.pass_widths.items())}
        if not self.stop_detail:
            data.pop("stop_detail")
        if not self.prompt_cache_note:
            data.pop("prompt_cache_note")
        data.update(
            acceptance_rate=self.acceptance_rate,
            alpha=self.alpha,
            tokens_per_pass=self.tokens_per_pass,
            tokens_per_s=self.tokens_per_s,
            decode_tokens_per_s=self.decode_tokens_per_s,
            total_s=self.total_s,
            overhead_s=self.overhead_s,
            acceptance_per_position=self.acceptance_per_position,
            mean_k=self.mean_k,
        )
        return data

    def summary(self) -> str:
        line = (
            f"{self.new_tokens} tokens in {self.total_s:.2f} s ({self.tokens_per_s:.1f} tok/s)"
            f" | target passes {self.target_passes}"
        )
        if self.k:
            k_text = f"K=auto (mean {self.mean_k:.1f})" if self.adaptive else f"K={self.k}"
            line += (
                f" | drafter {self.drafter}, {k_text}"
                f" | acceptance {100 * self.acceptance_rate:.1f}%"
                f" | {self.tokens_per_pass:.2f} tokens/pass"
            )
        else:
            line += " | target alone"
        if self.stop_reason:
            line += f" | stop: {self.stop_reason}"
        return line
