// nostr-tools' NIP-77 client (NegentropySync) against a relay: reads {url, filter, items: [[created_at, id]]}
// as JSON on stdin, prints {have, need} (ids only this side has, ids only the relay has) as JSON.
import { readFileSync } from 'node:fs'
import WebSocket from 'ws'
import { Relay, useWebSocketImplementation } from 'nostr-tools/relay'
import { nip77 } from 'nostr-tools'

const { NegentropyStorageVector, NegentropySync } = nip77

useWebSocketImplementation(WebSocket)
const input = JSON.parse(readFileSync(0, 'utf8'))
const relay = await Relay.connect(input.url)
const storage = new NegentropyStorageVector()
for (const [ts, id] of input.items) storage.insert(ts, id)
storage.seal()
const have = []
const need = []
const error = await new Promise(resolve => {
  const sync = new NegentropySync(relay, storage, input.filter, {
    onhave: id => have.push(id),
    onneed: id => need.push(id),
    onclose: reason => resolve(reason),
  })
  sync.start()
})
relay.close()
console.log(JSON.stringify({ have, need, error: error ?? null }))
process.exit(0)
