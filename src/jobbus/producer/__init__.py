"""The producer and admin verbs: written once for asyncio (`_async`), generated for blocking code (`_sync`)."""
