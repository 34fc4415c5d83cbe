"""`recovery-ext spend-cap`: the spend caps of pipelines and deployments, and an operator's change to one."""

from __future__ import annotations

import click
from tabulate import tabulate

from recovery_ext._cli_common import ROW_ID, Amount, BadArgument, IntRange, Output, command
from recovery_ext._settings import check_deployment
from recovery_ext._errors import ConfigurationError
from recovery_ext._store.interfaces import CliStore
from recovery_ext._store.models import CAP_MAX_COST, CAP_MAX_TOKENS, CapState, deployment_scope, pipeline_scope


def _amount(value: float | int | None, money: bool) -> str:
    if value is None:
        return "-"
    return f"{value:.6g}" if money else str(value)


def cap_rows(caps: list[CapState]) -> list[tuple[str, ...]]:
    """One line per cap: its tokens and its money, each as cap / spent / reserved / left."""
    return [(c.scope, *(_amount(v, False) for v in (c.max_tokens, c.spent_tokens, c.reserved_tokens, c.left_tokens)),
             *(_amount(v, True) for v in (c.max_cost, c.spent_cost, c.reserved_cost, c.left_cost)), c.changed_by or "")
            for c in caps]


CAP_HEADERS = ["cap", "tokens cap", "spent", "reserved", "left", "money cap", "spent", "reserved", "left",
               "set by"]


def _scope(pipeline: int | None, deployment: str | None) -> str | None:
    if pipeline is not None and deployment is not None:
        raise BadArgument("give --pipeline or --deployment, not both")
    if deployment is not None:
        try:
            return deployment_scope(check_deployment("--deployment", deployment))
        except ConfigurationError as exc:
            raise BadArgument(str(exc)) from None
    return None if pipeline is None else pipeline_scope(pipeline)


@click.group("spend-cap")
def spend_cap() -> None:
    """Spend caps: the most tokens or money a pipeline (or a whole deployment) may spend on providers. A
    pipeline at its cap is paused (waiting, reason 'spend cap'), never failed, until its cap is raised."""


@spend_cap.command("list")
@click.option("--pipeline", type=ROW_ID, help="Only this pipeline's cap.")
@click.option("--deployment", metavar="NAME", help="Only this deployment's cap.")
@command
def list_caps(store: CliStore, out: Output, pipeline: int | None, deployment: str | None) -> None:
    """Each cap: its limit, what was spent, what is reserved by requests under way (or by processes killed
    mid-call: counted until settled) and what is left."""
    scope = _scope(pipeline, deployment)
    out.note_unknown_deployment(store, deployment)
    caps = store.providers.spend_caps(None if scope is None else [scope])
    out.emit([c.as_dict() for c in caps],
             lambda: click.echo(tabulate(cap_rows(caps), headers=CAP_HEADERS) if caps else "no spend caps"))


@spend_cap.command("set")
@click.option("--pipeline", type=ROW_ID, help="The cap of this pipeline.")
@click.option("--deployment", metavar="NAME", help="The cap of this deployment (all its pipelines together).")
@click.option("--tokens", type=IntRange(0, CAP_MAX_TOKENS), help="The new cap in tokens.")
@click.option("--cost", type=Amount(CAP_MAX_COST),
              help="The new cap in money (the price table's currency).")
@click.option("--no-token-cap", is_flag=True, help="Remove the cap in tokens.")
@click.option("--no-cost-cap", is_flag=True, help="Remove the cap in money.")
@command
def set_cap(store: CliStore, out: Output, pipeline: int | None, deployment: str | None, tokens: int | None,
            cost: float | None, no_token_cap: bool, no_cost_cap: bool) -> None:
    """Set a cap: raise, lower or remove one, or make one for a pipeline or deployment that has none yet (it
    holds from the pipeline's next node start). A pipeline paused at it goes on at its next look (the recovery
    resource's spend_cap_poll_seconds). The change stands until the run configuration's cap itself changes."""
    scope = _scope(pipeline, deployment)
    if scope is None:
        raise BadArgument("give --pipeline ID or --deployment NAME")
    if (tokens is not None and no_token_cap) or (cost is not None and no_cost_cap):
        raise BadArgument("give a new cap or remove it, not both")
    if tokens is None and cost is None and not no_token_cap and not no_cost_cap:
        raise BadArgument("give --tokens N, --cost AMOUNT, --no-token-cap or --no-cost-cap")
    new_tokens: int | None | bool = None if no_token_cap else (tokens if tokens is not None else False)
    new_cost: float | None | bool = None if no_cost_cap else (cost if cost is not None else False)
    cap = store.providers.spend_cap_set(scope, tokens=new_tokens, cost=new_cost, who="operator (recovery-ext)")
    out.emit(cap.as_dict(), lambda: click.echo(tabulate(cap_rows([cap]), headers=CAP_HEADERS)))
