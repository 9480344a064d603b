"""A payments MCP server that knows nothing of idem, on the official Python SDK (mcp 2.x, where
FastMCP is `MCPServer`), served over stdio. Every call it gets, it acts on: each charge and each
shipment appends one line to the file named by $PAYMENTS_EFFECTS, so the test counts effects by
counting lines, across every process that ran.
"""

import asyncio
import os

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

EFFECTS = os.environ["PAYMENTS_EFFECTS"]

server = MCPServer("payments-upstream")


def act(line: str) -> int:
    """Appends `line` and returns how many lines the file holds: a number no retry can repeat."""
    with open(EFFECTS, "a+", encoding="utf-8") as effects:
        effects.write(line + "\n")
        effects.flush()
        os.fsync(effects.fileno())
        effects.seek(0)
        return sum(1 for _ in effects)


@server.tool(description="Charge a card for an order")
def charge_card(order_id: str, amount: int) -> str:
    n = act(f"charge {order_id} {amount}")
    return f"ch_{n}_{order_id}_{amount}"


@server.tool(
    description="An account's balance",
    annotations=ToolAnnotations(read_only_hint=True),
)
def get_balance(account: str) -> str:
    return "100"


@server.tool(description="Ship an order; never answers after shipping")
async def ship_order(order_id: str) -> str:
    act(f"ship {order_id}")
    await asyncio.Event().wait()
    return "unreachable"


if __name__ == "__main__":
    server.run()
