"""Fault patterns shaped like the counterexamples of the TLA+ specifications and of BookKeeper's
"BP-46: Running without the journal", with seeded choices of bookies and seeded timing. The
nemesis draws them like any other fault; whether a run ends in a violation is still for the
checker to find. Each names the protection that defeats it:

- ``unfenced_read`` -- trap 1 of ``ProtocolSwitches`` (recovery reads must fence): the writer's
  entry reaches one bookie, is late to a second whose fencing LAC read was lost, and is refused by a
  third whose refusal is slow to come back; recovery hears two "no such entry" first.
- ``stale_writer`` -- BP-46 Scenario 1 (fence on boot): a hung writer wakes after its ledger
  was recovered without reaching one bookie and another bookie lost its disk.
- ``change_race`` -- acknowledgements held until an ensemble change's CAS lands: the writer
  replaces a bookie it cannot reach (another is slow) while a recoverer, which reaches it,
  closes the ledger on the old ensemble.

- ``lost_entry`` -- BP-46 Scenario 2 (limbo): a journal-less bookie loses acknowledged entries
  in a crash while a third bookie has not received them yet; recovery follows at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from aiobk.client import LedgerHandle

if TYPE_CHECKING:
    from tests.sim.nemesis import Nemesis

Scenario = Callable[["Nemesis", str, LedgerHandle, list[str]], Awaitable[None]]


def _node(bookie_id: str) -> str:
    return bookie_id.rsplit(":", 1)[0]


async def unfenced_read(n: Nemesis, writer: str, handle: LedgerHandle, nodes: list[str]) -> None:
    rng, net = n.rng, n.world.net
    b1, b2, b3 = rng.sample(nodes, 3)
    rec = n.new_recoverer()
    hold = rng.uniform(0.1, 0.6)
    n.cut([(writer, b1), (writer, b3)], hold)
    n.cut([(b1, writer)], hold + rng.uniform(0.05, 0.4))
    net.lag[(b2, rec)] = rng.uniform(0.002, 0.03)
    n.trace(f"unfenced_read: {writer} late to {b1},{b3}; {rec} loses its fence to {b3}")
    await n.workload.warm(rec, handle.ledger_id)
    net.reset_next(rec, b3)
    await n.workload.recover_one(rec, handle.ledger_id)
    net.lag.pop((b2, rec), None)


async def stale_writer(n: Nemesis, writer: str, handle: LedgerHandle, nodes: list[str]) -> None:
    rng, net, world = n.rng, n.world.net, n.world
    if n.data_loss_used:
        return
    b1, b2, b3 = rng.sample(nodes, 3)
    loop = asyncio.get_running_loop()
    hang = rng.uniform(0.3, 0.8)
    n.workload.stalled[writer] = loop.time() + hang
    rec = n.new_recoverer()
    n.trace(
        f"stale_writer: {writer} hangs {hang:.2f}s; {rec} never reaches {b3}; {b2} loses its disk"
    )
    n.cut([(rec, b3)], hang + rng.uniform(0.2, 0.5))
    net.lag[(b1, writer)] = rng.uniform(0.001, 0.02)
    await asyncio.sleep(rng.uniform(0.0, 0.05))
    await n.workload.recover_one(rec, handle.ledger_id)
    n.data_loss_used = True
    sim = world.bookies[b2]
    await world.wipe(sim)
    await world.start_bookie(sim)
    await asyncio.sleep(max(0.0, n.workload.stalled.get(writer, 0.0) - loop.time()) + 0.3)
    net.lag.pop((b1, writer), None)


async def change_race(n: Nemesis, writer: str, handle: LedgerHandle, nodes: list[str]) -> None:
    rng, net, world = n.rng, n.world.net, n.world
    if len(world.bookies) == len(nodes):
        return  # no spare bookie to change to
    b1, b2, b3 = rng.sample(nodes, 3)
    rec = n.new_recoverer()
    hold = rng.uniform(1.3, 2.0)  # past the writer's add timeout (1 s): an ensemble change
    n.cut([(writer, b3), (b3, writer)], hold)
    net.lag[(writer, b1)] = rng.uniform(0.2, 0.8)  # late, but not late enough to time out
    net.lag[(b2, rec)] = rng.uniform(0.002, 0.03)
    n.trace(f"change_race: {writer} loses {b3}, is slow to {b1}; {rec} recovers around the change")
    await asyncio.sleep(rng.uniform(0.9, 1.1))
    world.metadata_delay = 0.3
    await n.workload.recover_one(rec, handle.ledger_id)
    world.metadata_delay = 0.003
    await asyncio.sleep(1.0)
    net.lag.pop((b2, rec), None)
    net.lag.pop((writer, b1), None)


async def lost_entry(n: Nemesis, writer: str, handle: LedgerHandle, nodes: list[str]) -> None:
    rng, net, world = n.rng, n.world.net, n.world
    if n.data_loss_used or not world.journal_less:
        return
    b1, b2, b3 = rng.sample(nodes, 3)
    rec = n.new_recoverer()
    n.cut([(writer, b3)], rng.uniform(0.3, 0.8))
    net.lag[(b2, rec)] = rng.uniform(0.002, 0.03)
    n.trace(f"lost_entry: {writer} late to {b3}; {b1} crashes without its journal; {rec} recovers")
    await asyncio.sleep(rng.uniform(0.02, 0.2))
    n.data_loss_used = True
    sim = world.bookies[b1]
    await world.crash(sim, clean=False)
    await world.start_bookie(sim)
    await n.workload.recover_one(rec, handle.ledger_id)
    net.lag.pop((b2, rec), None)


SCENARIOS: dict[str, Scenario] = {
    "lost_entry": lost_entry,
    "unfenced_read": unfenced_read,
    "stale_writer": stale_writer,
    "change_race": change_race,
}
