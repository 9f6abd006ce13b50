// oneDNN (Debian libdnnl-dev 2.6) f32 NHWC convolution + bias + ReLU post-op: median microseconds a call.
// Built and run by bench/bench_onednn.py (g++ -O2 onednn_conv.cc -ldnnl); threads from OMP_NUM_THREADS.
#include <dnnl.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
using namespace dnnl;
int main(int argc, char** argv) {
  // args: N H W C O K stride pad groups
  int n = atoi(argv[1]), h = atoi(argv[2]), w = atoi(argv[3]), c = atoi(argv[4]), o = atoi(argv[5]);
  int k = atoi(argv[6]), s = atoi(argv[7]), p = atoi(argv[8]), g = atoi(argv[9]);
  int oh = (h + 2 * p - k) / s + 1, ow = (w + 2 * p - k) / s + 1;
  engine eng(engine::kind::cpu, 0); stream st(eng);
  memory::dims src_d = {n, c, h, w}, dst_d = {n, o, oh, ow}, b_d = {o};
  memory::dims w_d = g == 1 ? memory::dims{o, c, k, k} : memory::dims{g, o / g, c / g, k, k};
  auto src_md = memory::desc(src_d, memory::data_type::f32, memory::format_tag::nhwc);
  auto dst_md = memory::desc(dst_d, memory::data_type::f32, memory::format_tag::nhwc);
  auto w_any = memory::desc(w_d, memory::data_type::f32, memory::format_tag::any);
  auto b_md = memory::desc(b_d, memory::data_type::f32, memory::format_tag::x);
  auto desc = convolution_forward::desc(prop_kind::forward_inference, algorithm::convolution_direct,
      src_md, w_any, b_md, dst_md, {s, s}, {p, p}, {p, p});
  post_ops ops; ops.append_eltwise(1.f, algorithm::eltwise_relu, 0.f, 0.f);
  primitive_attr attr; attr.set_post_ops(ops);
  auto pd = convolution_forward::primitive_desc(desc, attr, eng);
  memory src(src_md, eng), dst(dst_md, eng), bias(b_md, eng), wts(pd.weights_desc(), eng);
  std::fill((float*)src.get_data_handle(), (float*)src.get_data_handle() + src_md.get_size() / 4, 0.5f);
  std::fill((float*)wts.get_data_handle(), (float*)wts.get_data_handle() + pd.weights_desc().get_size() / 4, 0.01f);
  convolution_forward conv(pd);
  auto run = [&] { conv.execute(st, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wts}, {DNNL_ARG_BIAS, bias}, {DNNL_ARG_DST, dst}}); st.wait(); };
  for (int i = 0; i < 20; ++i) run();
  std::vector<double> t;
  for (int r = 0; r < 15; ++r) {
    auto a = std::chrono::steady_clock::now();
    for (int i = 0; i < 20; ++i) run();
    t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count() / 20);
  }
  std::sort(t.begin(), t.end());
  printf("%.1f %s\n", t[t.size() / 2], pd.impl_info_str());
}
