"""An MCP host on the official Python SDK's client (mcp 2.x: `stdio_client` and `ClientSession`):
it spawns the server command given after `--` (here `idem mcp-proxy … -- python payments.py`),
makes the calls listed as JSON in its first argument, in order, and prints each result as one
JSON line on stdout for the Rust test to read.

    host.py '[{"tool": "charge_card", "arguments": {...}, "meta": {...}}]' -- COMMAND ARGS...
"""

import asyncio
import json
import os
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


async def main(calls: list[dict], command: list[str]) -> None:
    # The SDK passes only a default environment (PATH, HOME…) to the server; the upstream needs
    # $PAYMENTS_EFFECTS, so the whole environment goes on, as a host's configuration would say.
    server = StdioServerParameters(command=command[0], args=command[1:], env=dict(os.environ))
    async with stdio_client(server) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            for call in calls:
                result = await session.call_tool(
                    call["tool"], call.get("arguments"), meta=call.get("meta")
                )
                print(
                    json.dumps(
                        {
                            "isError": result.is_error,
                            "structuredContent": result.structured_content,
                            "text": [block.text for block in result.content],
                        },
                        sort_keys=True,
                    ),
                    flush=True,
                )


if __name__ == "__main__":
    split = sys.argv.index("--")
    asyncio.run(main(json.loads(sys.argv[1]), sys.argv[split + 1 :]))
