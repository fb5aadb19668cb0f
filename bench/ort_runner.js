// Times ONNX Runtime (npm onnxruntime-node, CPU) on one model: inputs from .npy files,
// all graph optimizations, the given thread count. Prints JSON with the median latency
// and writes the outputs as .npy for the accuracy check.
// Usage: node ort_runner.js MODEL THREADS DURATION_S OUT_DIR INPUT.npy...
const ort = require('onnxruntime-node');
const fs = require('fs');
const path = require('path');

const DTYPES = {'<f4': ['float32', Float32Array], '<i8': ['int64', BigInt64Array], '<i4': ['int32', Int32Array], '|b1': ['bool', Uint8Array]};

function readNpy(file) {
  const buf = fs.readFileSync(file);
  const headerLen = buf.readUInt16LE(8);
  const header = buf.toString('latin1', 10, 10 + headerLen);
  const descr = /'descr':\s*'([^']+)'/.exec(header)[1];
  const shape = /'shape':\s*\(([^)]*)\)/.exec(header)[1].split(',').filter(s => s.trim()).map(Number);
  const [type, Ctor] = DTYPES[descr];
  const data = buf.subarray(10 + headerLen);
  const copy = new Uint8Array(data);  // aligned copy
  return new ort.Tensor(type, new Ctor(copy.buffer, 0, copy.byteLength / Ctor.BYTES_PER_ELEMENT), shape);
}

function writeNpy(file, tensor) {
  const header = `{'descr': '<f4', 'fortran_order': False, 'shape': (${tensor.dims.join(', ')}${tensor.dims.length === 1 ? ',' : ''}), }`;
  const padded = header + ' '.repeat((64 - ((10 + header.length + 1) % 64)) % 64) + '\n';
  const head = Buffer.alloc(10);
  head.write('\x93NUMPY', 0, 'latin1');
  head[6] = 1; head[7] = 0;
  head.writeUInt16LE(padded.length, 8);
  fs.writeFileSync(file, Buffer.concat([head, Buffer.from(padded, 'latin1'), Buffer.from(new Float32Array(tensor.data).buffer)]));
}

async function main() {
  const [model, threads, duration, outDir, ...inputs] = process.argv.slice(2);
  const session = await ort.InferenceSession.create(model, {graphOptimizationLevel: 'all', intraOpNumThreads: Number(threads), interOpNumThreads: 1});
  const feeds = {};
  session.inputNames.forEach((name, i) => { feeds[name] = readNpy(inputs[i]); });
  let out;
  for (let i = 0; i < 5; i++) out = await session.run(feeds);
  const times = [];
  const start = process.hrtime.bigint();
  while (times.length < 10 || Number(process.hrtime.bigint() - start) / 1e9 < Number(duration)) {
    const t0 = process.hrtime.bigint();
    await session.run(feeds);
    times.push(Number(process.hrtime.bigint() - t0) / 1e6);
  }
  times.sort((a, b) => a - b);
  session.outputNames.forEach((name, i) => writeNpy(path.join(outDir, `ort_output_${i}.npy`), out[name]));
  console.log(JSON.stringify({median_ms: times[Math.floor(times.length / 2)], runs: times.length}));
}
main().catch(e => { console.error(e.message); process.exit(1); });
