"""The appliance's own HTTP/1.1 and websocket front, on asyncio and public APIs.

    front.server     Server: listening sockets, the ASGI lifespan, the graceful stop
    front.http       HttpConnection: guarded request heads, per-address caps, requests to the
                     ASGI application (h11), websocket handshakes handed to the relay
    front.websocket  WebSocketConnection: RFC 6455 over websockets' sans-I/O ServerProtocol,
                     parsed a few KiB at a time as the relay takes the messages

The relay's websocket path goes through no ASGI layer: its sessions take messages from the
connection and write frames to it directly.
"""

from appliance.front.http import Guard, HttpConnection, Site, WebSocketRequest
from appliance.front.server import Server
from appliance.front.websocket import CLOSED, NOTHING, WebSocketConnection

__all__ = ["CLOSED", "NOTHING", "Guard", "HttpConnection", "Server", "Site", "WebSocketConnection",
           "WebSocketRequest"]
