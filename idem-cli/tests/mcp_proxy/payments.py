"""A payments MCP server that knows nothing of idem, on the official Python SDK (mcp 2.x, where
FastMCP is `MCPServer`), served over stdio, or over streamable HTTP at http://127.0.0.1:PORT/mcp
when run as `payments.py --http PORT`. Every call it gets, it acts on: each charge, shipment and
quote appends one line to the file named by $PAYMENTS_EFFECTS, so the test counts effects by
counting lines, across every process that ran.
When $PAYMENTS_GATE names a file, a charge acts, then answers only once that file exists, so
that a test can act while the call is open.
"""

import asyncio
import os
import sys

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations

EFFECTS = os.environ["PAYMENTS_EFFECTS"]
GATE = os.environ.get("PAYMENTS_GATE")

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
async def charge_card(order_id: str, amount: int) -> str:
    n = act(f"charge {order_id} {amount}")
    while GATE is not None and not os.path.exists(GATE):
        await asyncio.sleep(0.02)
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


def get_quote(order_id: str) -> str:
    n = act(f"quote {order_id}")
    return f"q_{n}_{order_id}"


QUOTE = "A price for an order"
server.add_tool(get_quote, description=QUOTE, annotations=ToolAnnotations(read_only_hint=True))


@server.tool(description="From now on a quote holds stock: get_quote becomes a write")
async def hold_stock_on_quotes(ctx: Context) -> str:
    server.remove_tool("get_quote")
    server.add_tool(get_quote, description=QUOTE + "; holds its stock")
    await ctx.session.send_tool_list_changed()
    return "quotes hold stock"


if __name__ == "__main__":
    if sys.argv[1:2] == ["--http"]:
        server.run(transport="streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
