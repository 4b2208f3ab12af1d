"""The simulated device's model: execution in virtual time, happens-before, memory, allocator, collectives.

One module per concept, each testable with plain values (see ``tests/property/model/``):

- ``config``: the cost model (virtual nanoseconds per byte, per launch, per host step);
- ``clock``: vector clocks;
- ``sync``: every happens-before edge (what each wait orders);
- ``streams``: queued operations, event records, markers;
- ``memory``: storages with byte-range shadow memory; the one function every access goes through;
- ``execution``: host actors, virtual time, delays, deadlock detection;
- ``allocator`` and ``memsaver``: the caching allocator and the pausable pools over it;
- ``collectives``: process groups and the all-gather rendezvous;
- ``reports``: what a run found, as data (and where in the program);
- ``runtime``: :class:`Runtime`, the model of one run, whose methods the façades call.

Nothing here knows ``torch.cuda``'s names or dispatch modes.
"""

from simdevice.runtime.config import UNIT_NS, SimConfig
from simdevice.runtime.runtime import Options, Runtime, inserted, inserted_edges
from simdevice.runtime.sync import Edge, Site

__all__ = ["UNIT_NS", "Edge", "Options", "Runtime", "SimConfig", "Site", "inserted", "inserted_edges"]
