#include "sparse/input_sparse.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <set>
#include <type_traits>

#include <fmt/ranges.h>

#include "core/error.hpp"
#include "core/log.hpp"
#include "core/mmap_file.hpp"
#include "core/timer.hpp"
#include "model/blocks.hpp"
#include "model/moe.hpp"
#include "ops/cpu/nm4/nm4.hpp"
#include "ops/cpu/r16/r16.hpp"

namespace ember {

static_assert(std::is_same_v<InputThresholds::value_type, decltype(Model::input_thresholds)::value_type>,
              "Model::input_thresholds holds one threshold per input site");

const char* input_site_name(int site) {
  static const char* names[kInputSites] = {"attn_in", "attn_out", "ffn_in", "ffn_hidden"};
  EMBER_CHECK(site >= 0 && site < kInputSites, "no input site {}", site);
  return names[site];
}

double input_copy_rate(size_t row_bytes) {
  struct Point {
    double bytes, rate;
  };
  static constexpr Point kMeasured[] = {{2048, 0.63}, {3072, 0.72}, {14336, 0.88}};
  const double b = static_cast<double>(row_bytes);
  if (b <= kMeasured[0].bytes) return kMeasured[0].rate;
  for (size_t i = 1; i < std::size(kMeasured); ++i)
    if (b <= kMeasured[i].bytes) {
      const Point& a = kMeasured[i - 1];
      const Point& c = kMeasured[i];
      return a.rate + (c.rate - a.rate) * std::log(b / a.bytes) / std::log(c.bytes / a.bytes);
    }
  return kMeasured[std::size(kMeasured) - 1].rate;
}

int64_t input_copy_max_kept(const std::vector<size_t>& row_bytes, const std::vector<size_t>& table_bytes,
                            size_t dense_bytes) {
  EMBER_CHECK(row_bytes.size() == table_bytes.size() && !row_bytes.empty(),
              "input_copy_max_kept: {} row sizes, {} table sizes", row_bytes.size(), table_bytes.size());
  double per_row = 0, fixed = 0;  // time of the copy path in dense bytes: per kept row, and whatever k
  for (size_t i = 0; i < row_bytes.size(); ++i) {
    const double r = input_copy_rate(row_bytes[i]);
    per_row += static_cast<double>(row_bytes[i]) / r;
    fixed += static_cast<double>(table_bytes[i]) / r;
  }
  const double k = (static_cast<double>(dense_bytes) - fixed) / per_row;
  return k < 0 ? -1 : static_cast<int64_t>(k);
}

namespace {

// The bytes of one row of the copy site_stacks would make of mats (rows: n_out of each), from the
// file's type of the first (a repacked matrix: its base type).
size_t copy_row_bytes(const std::vector<const TensorView*>& mats, cpu::NeuronMajorType choice) {
  int64_t n_out = 0;
  for (const TensorView* t : mats) n_out += t->rows();
  const DType file_type = cpu::r16_base(mats[0]->type);
  return row_bytes(cpu::neuron_major_dtype(file_type, choice, n_out, /*shared_scales=*/true), n_out);
}

// The stacks site_stacks makes of mats: runs [first, last) of one type and one input width.
std::vector<std::pair<size_t, size_t>> stack_runs(const std::vector<const TensorView*>& mats) {
  std::vector<std::pair<size_t, size_t>> runs;
  for (size_t i = 0; i < mats.size();) {
    size_t j = i + 1;
    while (j < mats.size() && mats[j]->type == mats[i]->type && mats[j]->cols() == mats[i]->cols()) ++j;
    runs.push_back({i, j});
    i = j;
  }
  return runs;
}

// What a decode token reads of each stack site_stacks would make of mats (before making it): the
// bytes of one kept input's row, and the shared-scale tables read whole.
void stack_read_bytes(const std::vector<const TensorView*>& mats, cpu::NeuronMajorType choice,
                      std::vector<size_t>& rows, std::vector<size_t>& tables) {
  for (const auto& [i, j] : stack_runs(mats)) {
    int64_t n_out = 0;
    for (size_t m = i; m < j; ++m) n_out += mats[m]->rows();
    const DType t = cpu::neuron_major_dtype(mats[i]->type, choice, n_out, /*shared_scales=*/true);
    rows.push_back(row_bytes(t, n_out));
    tables.push_back(cpu::is_nm4(t) ? cpu::nm4_table_bytes(t, mats[i]->cols(), n_out) : 0);
  }
}

}  // namespace

int64_t input_site_max_kept(const LayerWeights& file_L, const LayerWeights& own_L, int site,
                            cpu::NeuronMajorType copy_type, size_t min_row_bytes, bool by_cost) {
  if (input_site_dense(file_L, site, copy_type, min_row_bytes)) return kInputCopyNone;
  const bool file_down_t = site == static_cast<int>(InputSite::ffn_hidden) && !input_site_ffn(file_L).down.valid();
  if (!by_cost || file_down_t) return INT64_MAX;
  // The copy's rows and tables (before it is made) against the model's own matrices (repacked
  // or not: the same bytes).
  const InputSiteMatrices file = input_site_matrices(file_L), own = input_site_matrices(own_L);
  std::vector<size_t> rows, tables;
  stack_read_bytes(file.site[static_cast<size_t>(site)], copy_type, rows, tables);
  size_t dense = 0;
  for (const TensorView* t : own.site[static_cast<size_t>(site)]) dense += t->nbytes;
  const int64_t k = input_copy_max_kept(rows, tables, dense);
  return k < 0 ? kInputCopyNone : k;
}

bool input_copy_pays(int64_t max_kept, double dropped, int64_t n_in) {
  return max_kept >= 0 &&
         (1.0 - dropped) * static_cast<double>(n_in) <= kInputCopySlack * static_cast<double>(max_kept);
}

const FfnWeights& input_site_ffn(const LayerWeights& L) { return L.moe.valid() ? L.moe.experts[0] : L.ffn; }

void ffn_site_matrices(const FfnWeights& f, std::vector<const TensorView*>& in, std::vector<const TensorView*>& hidden) {
  in = {&f.firing_matrix()};
  if (ffn_needs_up(f)) in.push_back(&f.up);
  hidden = {f.down.valid() ? &f.down : &f.down_t};
}

InputSiteMatrices input_site_matrices(const LayerWeights& L) {
  InputSiteMatrices m;
  m.site[0] = {&L.wq, &L.wk, &L.wv};
  m.site[1] = {&L.wo};
  ffn_site_matrices(input_site_ffn(L), m.site[2], m.site[3]);
  return m;
}

bool input_site_dense(const LayerWeights& L, int site, cpu::NeuronMajorType copy_type, size_t min_row_bytes) {
  if (site == static_cast<int>(InputSite::ffn_hidden) && !input_site_ffn(L).down.valid()) return false;  // down_t
  return copy_row_bytes(input_site_matrices(L).site[static_cast<size_t>(site)], copy_type) < min_row_bytes;
}

std::array<double, kInputSites> input_site_weights(const LayerWeights& L) {
  const InputSiteMatrices m = input_site_matrices(L);
  std::array<double, kInputSites> w{};
  for (int s = 0; s < kInputSites; ++s)
    for (const TensorView* t : m.site[s]) w[s] += static_cast<double>(t->n_elements());
  if (L.moe.valid())  // a token reads n_used experts
    for (int s : {2, 3}) w[s] *= static_cast<double>(L.moe.n_used);
  return w;
}

int64_t select_inputs(const float* x, int64_t n, float threshold, int32_t* ids, float* vals) {
  int64_t k = 0;
  for (int64_t i = 0; i < n; ++i) {  // branch-free: about half pass, at random
    ids[k] = static_cast<int32_t>(i);
    vals[k] = x[i];
    k += std::fabs(x[i]) > threshold ? 1 : 0;
  }
  return k;
}

double InputSparsityStats::sparsity(int site) const {
  uint64_t s = 0, k = 0;
  for (size_t l = 0; l < seen.size(); ++l) s += seen[l][site], k += kept[l][site];
  return s == 0 ? 0.0 : 1.0 - static_cast<double>(k) / static_cast<double>(s);
}

double InputSparsityStats::copy_share(int site) const {
  uint64_t t = 0, c = 0;
  for (size_t l = 0; l < tokens.size(); ++l) t += tokens[l][site], c += copy_tokens[l][site];
  return t == 0 ? 0.0 : static_cast<double>(c) / static_cast<double>(t);
}

double InputSparsityStats::sparsity() const {
  double w = 0, d = 0;
  for (int s = 0; s < kInputSites; ++s) w += site_weights[s], d += site_weights[s] * sparsity(s);
  return w > 0 ? d / w : 0.0;
}

namespace {

// The input-channel-major copy of W (ne[0] = n_in, ne[1] = n_out): one row of n_out per input.
cpu::NeuronMajorMatrix channel_major_copy(ThreadPool& pool, const TensorView& W, cpu::NeuronMajorType choice) {
  const DType t = cpu::neuron_major_dtype(W.type, choice, W.rows(), /*shared_scales=*/true);
  return cpu::make_neuron_major(pool, W, t);
}

}  // namespace

std::vector<InputSparseExecutor::Stack> InputSparseExecutor::site_stacks(ThreadPool& pool,
                                                                         const std::vector<const TensorView*>& mats,
                                                                         cpu::NeuronMajorType choice, bool as_is) {
  std::vector<Stack> stacks;
  for (const auto& [i, j] : stack_runs(mats)) {  // mats[i, j): one type, one input width
    Stack st;
    for (size_t m = i; m < j; ++m) st.widths.push_back(as_is ? mats[m]->cols() : mats[m]->rows());  // outputs
    if (as_is) {  // the file's own neuron-major down_t: read as it is
      st.view = *mats[i];
    } else if (j == i + 1) {
      st.copy = channel_major_copy(pool, *mats[i], choice);
    } else {  // the matrices' rows one after another (the file's layout of their concatenation)
      const size_t rs = mats[i]->row_size();
      int64_t rows = 0;
      for (size_t m = i; m < j; ++m) rows += mats[m]->rows();
      AlignedBuffer<uint8_t> joined(rs * static_cast<size_t>(rows));
      uint8_t* p = joined.data();
      for (size_t m = i; m < j; ++m)
        for (int64_t r = 0; r < mats[m]->rows(); ++r, p += rs) std::memcpy(p, mats[m]->row(r), rs);
      TensorView v = matrix_view(mats[i]->type, joined.data(), rows, mats[i]->cols());
      v.name = mats[i]->name;
      st.copy = channel_major_copy(pool, v, choice);
    }
    if (st.copy.view.valid()) st.view = st.copy.view;
    stacks.push_back(std::move(st));
  }
  return stacks;
}

InputSparseExecutor::InputSparseExecutor(const Model& model, ThreadPool& pool, InputThresholds thresholds,
                                         cpu::NeuronMajorType copy_type, int64_t max_batch, size_t min_row_bytes,
                                         bool by_cost, std::vector<std::array<float, kInputSites>> dropped)
    : model_(model), thr_(std::move(thresholds)) {
  const Hparams& hp = model.hp;
  EMBER_CHECK(static_cast<int64_t>(thr_.size()) == hp.n_layer,
              "input sparsity: thresholds for {} layers, the model has {} (a profile of another model?)", thr_.size(),
              hp.n_layer);
  for (const auto& t : thr_)
    for (float v : t) EMBER_CHECK(std::isfinite(v), "input sparsity: threshold {} is not finite", v);
  EMBER_CHECK(dropped.empty() || dropped.size() == thr_.size(), "input sparsity: dropped shares for {} layers, "
              "thresholds for {}", dropped.size(), thr_.size());
  const std::string why = refusal(model);
  EMBER_CHECK(why.empty(), "{}", why);
  Timer timer;
  int64_t widest_in = hp.n_embd, widest_out = hp.n_embd, widest_stack = 0;
  copies_.reserve(model.layers.size());
  std::array<int64_t, kInputSites> dense_sites{}, unpaid_sites{};
  for (size_t l = 0; l < model.layers.size(); ++l) {
    const LayerWeights& L = model.file_layer(l);  // the copies come from the file's layout
    const InputSiteMatrices m = input_site_matrices(L), own = input_site_matrices(model.layers[l]);
    const bool moe = L.moe.valid();
    LayerCopies c;
    std::vector<ExpertCopies> ec(moe ? static_cast<size_t>(L.moe.n_expert()) : 0);
    std::array<bool, kInputSites> has{};
    std::array<int64_t, kInputSites> max_kept;  // per site: input_copy_max_kept, or every count
    max_kept.fill(INT64_MAX);
    for (int s = 0; s < kInputSites; ++s) {
      const bool file_down_t = s == static_cast<int>(InputSite::ffn_hidden) && !input_site_ffn(L).down.valid();
      if (input_site_dense(L, s, copy_type, min_row_bytes)) {
        ++dense_sites[s];  // no copy: decode runs the dense kernels on the masked input
        continue;
      }
      max_kept[s] = input_site_max_kept(L, model.layers[l], s, copy_type, min_row_bytes, by_cost);
      // A copy no token would read (it never pays, or the inputs keep too many on average): none,
      // the dense kernels on the masked input.
      const double drop = dropped.empty() ? 1.0 : dropped[l][static_cast<size_t>(s)];
      if (!input_copy_pays(max_kept[s], drop, m.site[s][0]->cols())) {
        ++unpaid_sites[s];
        continue;
      }
      std::vector<size_t> rows, tables;  // what the copy is checked against, below
      stack_read_bytes(m.site[s], copy_type, rows, tables);
      const auto made = [&](std::vector<Stack> stacks) {
        for (size_t i = 0; i < stacks.size(); ++i) {
          const Stack& st = stacks[i];
          widest_in = std::max(widest_in, st.view.rows());
          widest_out = std::max(widest_out, st.view.cols());
          if (st.widths.size() > 1) widest_stack = std::max(widest_stack, st.view.cols());
          EMBER_CHECK(file_down_t || (st.view.row_size() == rows[i] &&
                                      (!cpu::is_nm4(st.view.type) ||
                                       cpu::nm4_table_bytes(st.view.type, st.view.rows(), st.view.cols()) == tables[i])),
                      "input sparsity: layer {} site {}'s copy reads other bytes than were counted for it", l, s);
        }
        return stacks;
      };
      has[s] = true;
      if (!moe || s < static_cast<int>(InputSite::ffn_in)) {
        c[s] = made(site_stacks(pool, m.site[s], copy_type, file_down_t));
        continue;
      }
      for (size_t e = 0; e < ec.size(); ++e) {  // each expert's own copy, made by the first's rule
        std::array<std::vector<const TensorView*>, 2> em;
        ffn_site_matrices(L.moe.experts[e], em[0], em[1]);
        ec[e][static_cast<size_t>(s - 2)] = made(site_stacks(pool, em[static_cast<size_t>(s - 2)], copy_type, file_down_t));
      }
    }
    max_kept_.push_back(max_kept);
    has_copy_.push_back(has);
    copies_.push_back(std::move(c));
    experts_.push_back(std::move(ec));
    // The file's pages of matrices the model now holds repacked elsewhere were read only for the
    // copies: give them back (the file stays mapped).
    if (!model.file_layers.empty()) {
      const auto give_back = [](const std::vector<const TensorView*>& file, const std::vector<const TensorView*>& mine) {
        for (size_t i = 0; i < file.size(); ++i)
          if (mine[i]->data != file[i]->data) release_mapped_pages(file[i]->data, file[i]->nbytes);
      };
      for (int s = 0; s < kInputSites; ++s) give_back(m.site[s], own.site[s]);
      for (size_t e = 1; moe && e < ec.size(); ++e) {
        std::vector<const TensorView*> fi, fh, oi, oh;
        ffn_site_matrices(L.moe.experts[e], fi, fh);
        ffn_site_matrices(model.layers[l].moe.experts[e], oi, oh);
        give_back(fi, oi);
        give_back(fh, oh);
      }
    }
  }
  ids_.resize(static_cast<size_t>(widest_in));
  vals_.resize(static_cast<size_t>(widest_in));
  axpy_scratch_.resize(cpu::sparse_axpy_scratch_floats(widest_out, 1, pool.size(), cpu::AxpySplit::columns));
  stack_out_.resize(static_cast<size_t>(widest_stack));
  xm_.resize(static_cast<size_t>(max_batch * hp.n_embd));
  stats_.seen.assign(model.layers.size(), {});
  stats_.kept.assign(model.layers.size(), {});
  stats_.tokens.assign(model.layers.size(), {});
  stats_.copy_tokens.assign(model.layers.size(), {});
  stats_.copy_kept.assign(model.layers.size(), {});
  stats_.site_weights.assign(kInputSites, 0.0);
  for (const LayerWeights& L : model.layers) {
    const auto w = input_site_weights(L);
    for (int s = 0; s < kInputSites; ++s) stats_.site_weights[s] += w[s];
  }
  if (min_row_bytes == kInputNoCopies) return;  // asked for no copy: nothing to say
  std::set<std::string_view> types;  // the copies' types (the file's own down_t is no copy)
  for_each_stack([&](const Stack& st) {
    if (st.copy.view.valid()) types.insert(dtype_name(st.view.type));
  });
  log_info("input sparsity: input-channel-major copies of {} layers' matrices{}, {:.1f} MiB, in {:.1f} s",
           model.layers.size(), types.empty() ? "" : fmt::format(" ({})", fmt::join(types, ", ")),
           copy_bytes() / 1048576.0, timer.seconds());
  const auto listed = [&](const std::array<int64_t, kInputSites>& count) {  // "attn_in (3 of 8 layers), ..."
    std::string list;
    for (int s = 0; s < kInputSites; ++s)
      if (count[s] > 0)
        list += fmt::format("{}{} ({} of {} layers)", list.empty() ? "" : ", ", input_site_name(s), count[s],
                            model.layers.size());
    return list;
  };
  if (const std::string dense = listed(dense_sites); !dense.empty())
    log_info("input sparsity: {} decode with the dense kernels on the masked inputs: their input-channel-major "
             "rows would be under {} bytes, which read slower than dense",
             dense, min_row_bytes);
  if (const std::string unpaid = listed(unpaid_sites); !unpaid.empty())
    log_info("input sparsity: {} keep too many inputs for a copy to pay (the profile's shares): no copy made, the "
             "dense kernels on the masked inputs", unpaid);
}

std::string InputSparseExecutor::refusal(const Model& model) const {
  for (size_t l = 0; l < model.layers.size(); ++l) {
    const InputSiteMatrices m = input_site_matrices(model.layers[l]);
    for (const auto& site : m.site)
      for (const TensorView* t : site)
        if (!t->valid() || t->n_dims != 2)
          return fmt::format("--sparse-mode input: layer {} lacks a 2-D matrix it needs ({})", l,
                             t->valid() ? t->name : std::string("missing"));
  }
  return {};
}

void InputSparseExecutor::site_product(ThreadPool& pool, const std::vector<Stack>& stacks, int64_t n_kept,
                                       std::initializer_list<float*> dst) {
  float* const* d = dst.begin();
  for (const Stack& st : stacks) {
    const int64_t cols = st.view.cols();
    float* y = st.widths.size() == 1 ? *d : stack_out_.data();
    std::memset(y, 0, sizeof(float) * static_cast<size_t>(cols));
    if (n_kept > 0)
      cpu::sparse_axpy(pool, st.view, ids_.data(), n_kept, vals_.data(), 1, n_kept, y, cols, axpy_scratch_.data(),
                       cpu::AxpySplit::columns);
    if (st.widths.size() == 1) {
      ++d;
      continue;
    }
    for (int64_t w : st.widths) {  // hand each matrix its outputs
      std::memcpy(*d++, y, sizeof(float) * static_cast<size_t>(w));
      y += w;
    }
  }
  EMBER_CHECK(d == dst.end(), "input sparsity: {} outputs for {} matrices", static_cast<size_t>(d - dst.begin()), dst.size());
}

int64_t InputSparseExecutor::keep(int64_t layer, InputSite site, const float* x, int64_t n_in) {
  const int s = static_cast<int>(site);
  const int64_t k = select_inputs(x, n_in, thr_[static_cast<size_t>(layer)][s], ids_.data(), vals_.data());
  stats_.seen[static_cast<size_t>(layer)][s] += static_cast<uint64_t>(n_in);
  stats_.kept[static_cast<size_t>(layer)][s] += static_cast<uint64_t>(k);
  ++stats_.tokens[static_cast<size_t>(layer)][s];
  return k;
}

bool InputSparseExecutor::decode_via_copy(int64_t layer, InputSite site, const float* x, float* dense_in, int64_t n_in,
                                          int64_t& k) {
  const size_t l = static_cast<size_t>(layer), s = static_cast<size_t>(site);
  if (!dense_site(l, static_cast<int>(s))) {
    k = keep(layer, site, x, n_in);
    if (k <= max_kept_[l][s]) {
      ++stats_.copy_tokens[l][s];
      stats_.copy_kept[l][s] += static_cast<uint64_t>(k);
      return true;
    }
  }
  if (dense_in != x) std::memcpy(dense_in, x, sizeof(float) * static_cast<size_t>(n_in));
  if (dense_site(l, static_cast<int>(s))) keep_and_mask(layer, site, dense_in, n_in);
  else mask(dense_in, n_in, thr_[l][s]);  // counted by keep() above
  return false;
}

void InputSparseExecutor::mask(float* x, int64_t count, float t) {
  for (int64_t i = 0; i < count; ++i) x[i] = std::fabs(x[i]) <= t ? 0.0f : x[i];  // vectorizes: a blend
}

void InputSparseExecutor::mask(ThreadPool& pool, float* x, int64_t n, int64_t w, float t) {
  if (n * w < (int64_t{1} << 16)) return mask(x, n * w, t);
  pool.parallel_for(n, std::max<int64_t>(1, (int64_t{1} << 14) / w),
                    [&](int64_t r0, int64_t r1, int) { mask(x + r0 * w, (r1 - r0) * w, t); });
}

void InputSparseExecutor::keep_and_mask(int64_t layer, InputSite site, float* x, int64_t n_in, uint64_t runs) {
  const int s = static_cast<int>(site);
  const float t = thr_[static_cast<size_t>(layer)][s];
  int64_t k = 0;
  for (int64_t i = 0; i < n_in; ++i) {  // one pass: count what is kept, zero the rest
    const bool kept = std::fabs(x[i]) > t;
    k += kept ? 1 : 0;
    x[i] = kept ? x[i] : 0.0f;  // branch-free: about half are dropped, at random
  }
  stats_.seen[static_cast<size_t>(layer)][s] += runs * static_cast<uint64_t>(n_in);
  stats_.kept[static_cast<size_t>(layer)][s] += runs * static_cast<uint64_t>(k);
  stats_.tokens[static_cast<size_t>(layer)][s] += runs;
}

void InputSparseExecutor::qkv(ThreadPool& pool, int64_t layer, const LayerWeights& L, float* xn, int64_t n,
                              Workspace& ws) {
  const size_t l = static_cast<size_t>(layer);
  if (n > 1) {
    mask(pool, xn, n, L.wq.cols(), thr_[l][0]);
    stats_.batch_tokens += static_cast<uint64_t>(n);
    return dense_qkv(pool, L, xn, n, ws);
  }
  int64_t k = 0;
  if (decode_via_copy(layer, InputSite::attn_in, xn, xn, L.wq.cols(), k))
    return site_product(pool, copies_[l][0], k, {ws.q.data(), ws.k.data(), ws.v.data()});
  dense_qkv(pool, L, xn, 1, ws);
}

void InputSparseExecutor::out(ThreadPool& pool, int64_t layer, const LayerWeights& L, float* attn, int64_t n,
                              float* o, Workspace& ws) {
  const size_t l = static_cast<size_t>(layer);
  if (n > 1) {
    mask(pool, attn, n, L.wo.cols(), thr_[l][1]);
    return dense_out(pool, L, attn, n, o, ws);
  }
  int64_t k = 0;
  if (decode_via_copy(layer, InputSite::attn_out, attn, attn, L.wo.cols(), k))
    return site_product(pool, copies_[l][1], k, {o});
  dense_out(pool, L, attn, 1, o, ws);
}

void InputSparseExecutor::run(ThreadPool& pool, int64_t layer, const FfnWeights& w, cpu::Activation act,
                              const float* x, int64_t n, float* out, Workspace& ws) {
  if (n > 1) return batch_down(pool, layer, w, batch_values(pool, layer, w, act, x, n, ws), n, out, ws);
  const LayerCopies& c = copies_[static_cast<size_t>(layer)];
  decode_ffn(pool, layer, w, act, x, out, ws, c[2], c[3]);
}

void InputSparseExecutor::run_moe(ThreadPool& pool, int64_t layer, const MoeWeights& moe, cpu::Activation act,
                                  const float* x, int64_t n, float* out, Workspace& ws) {
  const size_t l = static_cast<size_t>(layer);
  if (n == 1 && (has_copy_[l][2] || has_copy_[l][3]))  // each chosen expert through its own copies
    return moe_ffn_each(pool, moe, x, 1, out, ws, [&](int64_t e, const float* rows, int64_t, float* o) {
      const ExpertCopies& c = experts_[l][static_cast<size_t>(e)];
      decode_ffn(pool, layer, moe.experts[static_cast<size_t>(e)], act, rows, o, ws, c[0], c[1]);
    });
  // The mixture's own paths with the experts' input masked (the router reads it whole) and the
  // values masked before the downs; a decode token counted once per chosen expert at each site.
  const int64_t d = moe.router.cols();
  const bool decode = n == 1;
  float* xm = xm_.data();
  std::memcpy(xm, x, sizeof(float) * static_cast<size_t>(n * d));
  if (decode) keep_and_mask(layer, InputSite::ffn_in, xm, d, static_cast<uint64_t>(moe.n_used));
  else mask(pool, xm, n, d, thr_[l][2]);
  MoeInputs in;
  in.experts_x = xm;
  in.values = [&](float* h, int64_t rows, int64_t n_ff) {
    if (!decode) return mask(pool, h, rows, n_ff, thr_[l][3]);
    for (int64_t r = 0; r < rows; ++r) keep_and_mask(layer, InputSite::ffn_hidden, h + r * n_ff, n_ff);
  };
  moe_ffn(pool, moe, act, x, n, out, ws, false, in);
}

void InputSparseExecutor::decode_ffn(ThreadPool& pool, int64_t layer, const FfnWeights& w, cpu::Activation act,
                                     const float* x, float* out, Workspace& ws, const std::vector<Stack>& in_stacks,
                                     const std::vector<Stack>& hidden_stacks) {
  const int64_t n_embd = w.n_embd(), n_ff = w.n_ff();
  float* h = ws.up.data();
  int64_t k = 0;
  if (decode_via_copy(layer, InputSite::ffn_in, x, xm_.data(), n_embd, k)) {
    float* a = ws.gate.data();
    if (ffn_needs_up(w)) site_product(pool, in_stacks, k, {a, h});
    else site_product(pool, in_stacks, k, {a});
    ffn_firing_values(w, act, a, 1, n_ff, n_ff, nullptr);
    ffn_neuron_values(w, act, a, n_ff, h, n_ff, 1, n_ff, nullptr);
  } else {
    ffn_firing_all(pool, w, act, xm_.data(), 1, ws);
    h = ffn_values_all(pool, w, act, xm_.data(), 1, ws);
  }
  if (!decode_via_copy(layer, InputSite::ffn_hidden, h, h, n_ff, k)) return ffn_down_all(pool, w, h, 1, out, ws);
  site_product(pool, hidden_stacks, k, {out});
  ffn_add_down_bias(w, out, 1);
}

float* InputSparseExecutor::batch_values(ThreadPool& pool, int64_t layer, const FfnWeights& w, cpu::Activation act,
                                         const float* x, int64_t n, Workspace& ws) {
  float* xm = xm_.data();  // the dense steps of model/ffn.hpp on the masked input
  std::memcpy(xm, x, sizeof(float) * static_cast<size_t>(n * w.n_embd()));
  mask(pool, xm, n, w.n_embd(), thr_[static_cast<size_t>(layer)][2]);
  ffn_firing_all(pool, w, act, xm, n, ws);
  return ffn_values_all(pool, w, act, xm, n, ws);
}

void InputSparseExecutor::batch_down(ThreadPool& pool, int64_t layer, const FfnWeights& w, float* h, int64_t n,
                                     float* out, Workspace& ws) {
  mask(pool, h, n, w.n_ff(), thr_[static_cast<size_t>(layer)][3]);
  ffn_down_all(pool, w, h, n, out, ws);
}

void InputSparseExecutor::set_thresholds(int64_t layer, const std::array<float, kInputSites>& t) {
  EMBER_CHECK(layer >= 0 && layer < static_cast<int64_t>(thr_.size()), "input sparsity: no layer {} of {}", layer,
              thr_.size());
  for (float v : t) EMBER_CHECK(std::isfinite(v), "input sparsity: threshold {} is not finite", v);
  thr_[static_cast<size_t>(layer)] = t;
}

void InputSparseExecutor::reset_stats() {
  for (auto* v : {&stats_.seen, &stats_.kept, &stats_.tokens, &stats_.copy_tokens, &stats_.copy_kept})
    for (auto& a : *v) a.fill(0);
  stats_.batch_tokens = 0;
}

size_t InputSparseExecutor::copy_bytes() const {
  size_t b = 0;
  for_each_stack([&](const Stack& st) { b += st.copy.bytes.size(); });
  return b;
}

size_t InputSparseExecutor::bytes() const {
  return copy_bytes() +
         (ids_.size() + vals_.size() + axpy_scratch_.size() + stack_out_.size() + xm_.size()) * sizeof(float);
}

double InputSparseExecutor::weight_bytes_per_token() const {
  double total = static_cast<double>(model_.weight_bytes_per_token()), tokens = 0;
  for (size_t l = 0; l < copies_.size(); ++l) {
    const LayerWeights& L = model_.layers[l];
    const LayerCopies& c = copies_[l];
    const double t = static_cast<double>(stats_.seen[l][0]) / static_cast<double>(L.wq.cols());
    if (t <= 0) continue;
    tokens = std::max(tokens, t);
    const InputSiteMatrices m = input_site_matrices(L);
    for (int s = 0; s < kInputSites; ++s) {
      // The tokens that read the site's copy read its kept rows and its tables instead of its
      // matrices; the others (all of a dense site's) read the matrices whole. A mixture's FFN
      // sites count each chosen expert's run (share up to n_used), every expert of the first's size.
      const bool expert = L.moe.valid() && s >= static_cast<int>(InputSite::ffn_in);
      const std::vector<Stack>& stacks = expert ? experts_[l][0][static_cast<size_t>(s - 2)] : c[s];
      const double share = static_cast<double>(stats_.copy_tokens[l][s]) / t;
      if (share <= 0) continue;
      for (const TensorView* f : m.site[s]) total -= share * static_cast<double>(f->nbytes);
      const double kept_rows = static_cast<double>(stats_.copy_kept[l][s]) / t;  // per token
      for (const Stack& st : stacks) {
        const TensorView& v = st.view;
        total += kept_rows * static_cast<double>(v.row_size());
        if (cpu::is_nm4(v.type))
          total += share * static_cast<double>(cpu::nm4_table_bytes(v.type, v.rows(), v.cols()));
      }
    }
  }
  return tokens > 0 ? total : 0.0;
}

}  // namespace ember
