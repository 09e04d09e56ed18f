// A line-oriented driver around ts-mls (an independent RFC 9420 implementation) for cross-checks.
// Reads one JSON command per line on stdin, writes one JSON answer per line on stdout. Bytes are hex.
import * as readline from "node:readline"
import {
  acceptAll, createApplicationMessage, createCommit, createGroup, createGroupInfoWithExternalPubAndRatchetTree,
  decodeMlsMessage, defaultCapabilities, defaultLifetime, encodeMlsMessage, generateKeyPackage, getCiphersuiteFromName,
  getCiphersuiteImpl, joinGroup, joinGroupExternal, makePskIndex, mlsExporter, processMessage, bytesToBase64,
} from "ts-mls"
import { createGroupInfoWithRatchetTree } from "ts-mls/createCommit.js"

const impl = await getCiphersuiteImpl(getCiphersuiteFromName("MLS_128_DHKEMX25519_AES128GCM_SHA256_Ed25519"))
const hex = (b) => Buffer.from(b).toString("hex")
const unhex = (s) => new Uint8Array(Buffer.from(s, "hex"))
const states = {}
const pendingKeyPackages = {}

async function keyPackage(name) {
  const credential = { credentialType: "basic", identity: new TextEncoder().encode(name) }
  return generateKeyPackage(credential, defaultCapabilities(), defaultLifetime, [], impl)
}

function psks(state, map) {
  const ext = {}
  for (const [id, value] of Object.entries(map || {})) ext[bytesToBase64(unhex(id))] = unhex(value)
  return makePskIndex(state, ext)
}

function view(state) {
  return { epoch: Number(state.groupContext.epoch), epoch_authenticator: hex(state.keySchedule.epochAuthenticator),
           group_context_tree_hash: hex(state.groupContext.treeHash) }
}

const ops = {
  // ts-mls creates a group of `members` (first one is the creator), all joined by Welcome
  async create({ group_id, members }) {
    const kps = await Promise.all(members.map(keyPackage))
    let creator = await createGroup(unhex(group_id), kps[0].publicPackage, kps[0].privatePackage, [], impl)
    const adds = kps.slice(1).map((k) => ({ proposalType: "add", add: { keyPackage: k.publicPackage } }))
    const res = await createCommit({ state: creator, cipherSuite: impl }, { extraProposals: adds, ratchetTreeExtension: true })
    states[members[0]] = res.newState
    for (let i = 1; i < members.length; i++) {
      states[members[i]] = await joinGroup(res.welcome, kps[i].publicPackage, kps[i].privatePackage, makePskIndex(undefined, {}), impl)
    }
    return view(states[members[0]])
  },
  // ts-mls 1.6.4 writes the external_pub extension as the bare key; RFC 9420 (and OpenMLS) frame it
  // as HPKEPublicKey external_pub<V>. `rfc` builds the RFC form with ts-mls's own GroupInfo signer.
  async group_info({ who, rfc }) {
    const state = states[who]
    let gi
    if (rfc) {
      const kp = await impl.hpke.deriveKeyPair(state.keySchedule.externalSecret)
      const pub = await impl.hpke.exportPublicKey(kp.publicKey)
      const ext = { extensionType: "external_pub", extensionData: new Uint8Array([pub.length, ...pub]) }
      gi = await createGroupInfoWithRatchetTree(state.groupContext, state.confirmationTag, state, state.ratchetTree, [ext], impl)
    } else {
      gi = await createGroupInfoWithExternalPubAndRatchetTree(state, [], impl)
    }
    return { group_info: hex(encodeMlsMessage({ version: "mls10", wireformat: "mls_group_info", groupInfo: gi })) }
  },
  async export({ who, label, context, length }) {
    const out = await mlsExporter(states[who].keySchedule.exporterSecret, label, unhex(context), length, impl)
    return { secret: hex(out) }
  },
  async process({ who, message, psk_values }) {
    const [msg] = decodeMlsMessage(unhex(message), 0)
    const res = await processMessage(msg, states[who], psks(states[who], psk_values), acceptAll, impl)
    states[who] = res.newState
    if (res.kind === "applicationMessage") return { kind: "application", data: hex(res.message), ...view(res.newState) }
    return { kind: "state", ...view(res.newState) }
  },
  async external_join({ who, group_info }) {
    const [msg] = decodeMlsMessage(unhex(group_info), 0)
    const kp = await keyPackage(who)
    const res = await joinGroupExternal(msg.groupInfo, kp.publicPackage, kp.privatePackage, false, impl)
    states[who] = res.newState
    const commit = encodeMlsMessage({ version: "mls10", wireformat: "mls_public_message", publicMessage: res.publicMessage })
    return { message: hex(commit), ...view(res.newState) }
  },
  async key_package({ who }) {
    const kp = await keyPackage(who)
    pendingKeyPackages[who] = kp
    return { key_package: hex(encodeMlsMessage({ version: "mls10", wireformat: "mls_key_package", keyPackage: kp.publicPackage })) }
  },
  async join({ who, welcome, psk_values }) {
    const [msg] = decodeMlsMessage(unhex(welcome), 0)
    const kp = pendingKeyPackages[who]
    states[who] = await joinGroup(msg.welcome, kp.publicPackage, kp.privatePackage, psks(undefined, psk_values), impl)
    return view(states[who])
  },
  async encrypt({ who, data }) {
    const res = await createApplicationMessage(states[who], unhex(data), impl)
    states[who] = res.newState
    return { message: hex(encodeMlsMessage({ version: "mls10", wireformat: "mls_private_message", privateMessage: res.privateMessage })) }
  },
}

const rl = readline.createInterface({ input: process.stdin })
for await (const line of rl) {
  let answer
  try {
    const cmd = JSON.parse(line)
    answer = { ok: true, ...(await ops[cmd.op](cmd)) }
  } catch (err) {
    answer = { ok: false, error: String(err && err.stack ? err.stack : err) }
  }
  process.stdout.write(JSON.stringify(answer) + "\n")
}
