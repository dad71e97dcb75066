# Converts the single-node ONNX backend tests of the tensor ops into the plain-text
# case file read by ops/src/tensor/conformance.rs (needs python3 with onnx + numpy):
#   python3 onnx_cases.py  ->  /tmp/kiln_tensor/cases.txt
import onnx, onnx.numpy_helper as nh, numpy as np, glob, os, re, sys
root = '/work/onnx-node-tests'
pats = r'^test_(reshape|flatten|squeeze|unsqueeze|concat|split|slice|pad|edge_pad|reflect_pad|wrap_pad|constant_pad|transpose|gather_[0-9]|gather_negative|cast_|castlike_|shape|size|expand|tile|where|range|resize|upsample|constantofshape|constant$|identity$|dropout)'
DT = {np.float32:'f32', np.float64:'f64', np.float16:'f16', np.int8:'i8', np.int16:'i16', np.int32:'i32', np.int64:'i64', np.uint8:'u8', np.uint16:'u16', np.uint32:'u32', np.uint64:'u64', np.bool_:'bool'}
def dt(a):
    for k,v in DT.items():
        if a.dtype == k: return v
    return None
def fmt(a):
    d = dt(a)
    if d is None: return None
    vals = ' '.join(repr(float(x)) if d.startswith('f') else str(int(x)) for x in a.reshape(-1))
    return f"{d} {a.ndim} {' '.join(map(str,a.shape))} {vals}".replace('  ',' ')
out = []
for t in sorted(os.listdir(root)):
    if not re.match(pats, t) or 'expanded' in t or 'sequence' in t: continue
    m = onnx.load(f'{root}/{t}/model.onnx')
    if len(m.graph.node) != 1: continue
    n = m.graph.node[0]
    opset = [o.version for o in m.opset_import if o.domain in ('', 'ai.onnx')][0]
    lines = [f'case {t}', f'op {n.op_type} {opset} {len(n.input)} {len(n.output)}']
    ok = True
    for a in n.attribute:
        if a.type == onnx.AttributeProto.INT: lines.append(f'attr {a.name} int {a.i}')
        elif a.type == onnx.AttributeProto.FLOAT: lines.append(f'attr {a.name} float {a.f!r}')
        elif a.type == onnx.AttributeProto.INTS: lines.append(f'attr {a.name} ints {" ".join(map(str,a.ints))}')
        elif a.type == onnx.AttributeProto.FLOATS: lines.append(f'attr {a.name} floats {" ".join(map(repr,a.floats))}')
        elif a.type == onnx.AttributeProto.STRING: lines.append(f'attr {a.name} string {a.s.decode()}')
        elif a.type == onnx.AttributeProto.TENSOR:
            f = fmt(nh.to_array(a.t))
            if f is None: ok = False; break
            lines.append(f'attr {a.name} tensor {f}')
        else: ok = False
    ds = f'{root}/{t}/test_data_set_0'
    present = [i for i, name in enumerate(n.input)]
    ins = sorted(glob.glob(f'{ds}/input_*.pb'), key=lambda p: int(re.findall(r'\d+', os.path.basename(p))[0]))
    # map graph inputs to node input positions
    gin = [i.name for i in m.graph.input]
    for p in ins:
        k = int(re.findall(r'\d+', os.path.basename(p))[0])
        tp = onnx.TensorProto(); tp.ParseFromString(open(p,'rb').read())
        try: arr = nh.to_array(tp)
        except Exception: ok = False; break
        pos = list(n.input).index(gin[k])
        f = fmt(arr)
        if f is None: ok = False; break
        lines.append(f'input {pos} {f}')
    for p in sorted(glob.glob(f'{ds}/output_*.pb')):
        k = int(re.findall(r'\d+', os.path.basename(p))[0])
        tp = onnx.TensorProto(); tp.ParseFromString(open(p,'rb').read())
        try: arr = nh.to_array(tp)
        except Exception: ok = False; break
        f = fmt(arr)
        if f is None: ok = False; break
        lines.append(f'output {k} {f}')
    if not ok: 
        print('skip', t, file=sys.stderr); continue
    lines.append('end')
    out.append('\n'.join(lines))
os.makedirs('/tmp/kiln_tensor', exist_ok=True); open('/tmp/kiln_tensor/cases.txt','w').write('\n'.join(out) + '\n')
print(len(out), 'cases')
