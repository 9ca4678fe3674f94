// Trains a small CNN or ViT on Fashion-MNIST with LibTorch, with dropit caching the saved tensors,
// and reports MEASURED memory (a counting CPU allocator) and accuracy.
//
//   fashion_mnist --model cnn|vit --policy none|mink|random --gamma G --epochs E --batch-size B
//                 --limit N --seed S --csv FILE [--masks on|off] [--fuse-pool-relu on|off]
//                 [--mlp gelu|relu] [--threads T]
//                 [--codec exact|int8|fp8] [--store CLASSES|all] [--store-codec int8|fp8|exact]
//                 [--data DIR] [--lr LR] [--exclude PATH]... [--layer-gamma PATH=G]...
//
// Exit codes: 0 done (and the training loss fell), 1 the loss did not fall, 2 bad arguments,
// 77 the data set is missing.
#include <dropit/torch.hpp>

#include "data.hpp"
#include "models.hpp"
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <map>
#include <numeric>
#include <string>
#include <vector>

namespace {

namespace dt = dropit::torch;
using clock_type = std::chrono::steady_clock;

struct options {
  std::string model = "cnn";
  std::string policy = "mink";
  double gamma = 0.9;
  int epochs = 1;
  std::int64_t batch = 128;
  std::int64_t limit = 0;
  std::uint64_t seed = 0;
  std::string csv;
  bool masks = true;
  bool fuse_pool_relu = true;  ///< MaxPool2d + ReLU as one op (convert_options::fuse_pool_relu)
  bool relu_mlp = true;
  int threads = 2;
  double lr = 0.0;           // 0: the model's default
  long long chunk_kib = -1;  // -1: the library's default piece size
  std::string data = "/usr/share/datasets/fashion-mnist";
  std::vector<std::string> exclude;  // module paths to leave dense ("0": the CNN's first conv)
  std::map<std::string, double> layer_gamma;  // --layer-gamma PATH=G
  std::string codec = "exact";  // how the kept values of Linear/Conv inputs are stored
  std::string store;            // classes kept through store_codec ("layernorm,softmax", "all")
  std::string store_codec = "int8";
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "fashion_mnist: %s\nusage: fashion_mnist [--model cnn|vit] [--policy "
               "none|mink|random] [--gamma G] [--epochs E] [--batch-size B] [--limit N] [--seed S] "
               "[--csv FILE] [--masks on|off] [--fuse-pool-relu on|off] [--mlp gelu|relu] "
               "[--threads T] [--lr LR] [--data "
               "DIR] [--exclude PATH]... [--layer-gamma PATH=G]... [--codec exact|int8|fp8] "
               "[--store layernorm,gelu,softmax,matmul,dropout,batchnorm|all] "
               "[--store-codec int8|fp8|exact]\n",
               why.c_str());
  std::exit(2);
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage("missing value after " + a);
      return argv[++i];
    };
    try {
      if (a == "--model") {
        o.model = value();
      } else if (a == "--policy") {
        o.policy = value();
      } else if (a == "--gamma") {
        o.gamma = std::stod(value());
      } else if (a == "--epochs") {
        o.epochs = std::stoi(value());
      } else if (a == "--batch-size") {
        o.batch = std::stoll(value());
      } else if (a == "--limit") {
        o.limit = std::stoll(value());
      } else if (a == "--seed") {
        o.seed = std::stoull(value());
      } else if (a == "--csv") {
        o.csv = value();
      } else if (a == "--masks") {
        const std::string v = value();
        if (v != "on" && v != "off") usage("--masks takes on or off");
        o.masks = v == "on";
      } else if (a == "--fuse-pool-relu") {
        const std::string v = value();
        if (v != "on" && v != "off") usage("--fuse-pool-relu takes on or off");
        o.fuse_pool_relu = v == "on";
      } else if (a == "--mlp") {
        const std::string v = value();
        if (v != "gelu" && v != "relu") usage("--mlp takes gelu or relu");
        o.relu_mlp = v == "relu";
      } else if (a == "--threads") {
        o.threads = std::stoi(value());
      } else if (a == "--chunk-kib") {
        o.chunk_kib = std::stoll(value());
      } else if (a == "--lr") {
        o.lr = std::stod(value());
      } else if (a == "--data") {
        o.data = value();
      } else if (a == "--exclude") {
        o.exclude.push_back(value());
      } else if (a == "--layer-gamma") {
        const std::string v = value();
        const std::size_t eq = v.rfind('=');
        if (eq == std::string::npos) usage("--layer-gamma takes PATH=GAMMA, got " + v);
        o.layer_gamma[v.substr(0, eq)] = std::stod(v.substr(eq + 1));
      } else if (a == "--codec") {
        o.codec = value();
      } else if (a == "--store") {
        o.store = value();
      } else if (a == "--store-codec") {
        o.store_codec = value();
      } else if (a == "--help" || a == "-h") {
        usage("help");
      } else {
        usage("unknown argument " + a);
      }
    } catch (const std::logic_error&) {
      usage("bad value for " + a);
    }
  }
  if (o.model != "cnn" && o.model != "vit") usage("--model takes cnn or vit");
  if (o.epochs < 1 || o.batch < 1 || o.limit < 0 || o.threads < 1) usage("bad sizes");
  return o;
}

std::string mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", bytes / (1024.0 * 1024.0));
  return buf;
}

/// A one-line progress bar on a terminal; nothing when stderr is not one.
class progress {
 public:
  explicit progress(bool on) : on_(on) {}
  void update(int epoch, int epochs, std::int64_t done, std::int64_t total, double loss,
              double rate) {
    if (!on_) return;
    const auto now = clock_type::now();
    if (done < total && now - last_ < std::chrono::milliseconds(200)) return;
    last_ = now;
    constexpr int width = 30;
    const int fill = static_cast<int>(width * done / std::max<std::int64_t>(total, 1));
    std::fprintf(stderr, "\repoch %d/%d [%s%s] %lld/%lld  loss %.4f  %.0f samples/s ", epoch,
                 epochs, std::string(fill, '#').c_str(), std::string(width - fill, '.').c_str(),
                 static_cast<long long>(done), static_cast<long long>(total), loss, rate);
    if (done >= total) std::fprintf(stderr, "\n");
  }

 private:
  bool on_;
  clock_type::time_point last_{};
};

double evaluate(torch::nn::Module& net, const std::function<torch::Tensor(torch::Tensor)>& fwd,
                const fmnist::split& test) {
  torch::NoGradGuard no_grad;
  net.eval();
  std::int64_t correct = 0;
  const std::int64_t n = test.images.size(0);
  for (std::int64_t b = 0; b < n; b += 1000) {
    const std::int64_t e = std::min(n, b + 1000);
    auto pred = fwd(test.images.slice(0, b, e)).argmax(1);
    correct += pred.eq(test.labels.slice(0, b, e)).sum().item<std::int64_t>();
  }
  net.train();
  return 100.0 * static_cast<double>(correct) / static_cast<double>(n);
}

/// The paths separated by ';' (a CSV field without quoting).
std::string joined(const std::vector<std::string>& paths) {
  std::string out;
  for (const std::string& p : paths)
    out += (out.empty() ? "" : ";") + p;
  return out;
}

/// "+gamma:PATH=G;PATH=G" of --layer-gamma for the CSV's policy field ("" without).
std::string layer_gammas(const std::map<std::string, double>& gammas) {
  std::string out;
  for (const auto& [path, gamma] : gammas) {
    out += out.empty() ? "+gamma:" : ";";
    out += path + "=" + std::to_string(gamma);
  }
  return out;
}

std::string today() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&t));
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  const options opt = parse(argc, argv);
  dt::policy policy;
  dt::store_options store;
  try {
    policy = dt::policy::parse(opt.policy, opt.policy == "none" ? 0.0 : opt.gamma, opt.seed);
    policy.codec = dt::parse_codec(opt.codec);
    store = dt::store_options::parse(opt.store, dt::parse_codec(opt.store_codec));
  } catch (const dropit::error& e) {
    usage(e.what());
  }
  torch::set_num_threads(opt.threads);
  if (opt.chunk_kib >= 0) dt::set_chunk_bytes(static_cast<std::size_t>(opt.chunk_kib) * 1024);
  torch::manual_seed(opt.seed);

  // Every CPU allocation from here on is counted, dropit's payloads included.
  dt::counting_allocator counter;
  dt::cpu_allocator_guard install(counter);

  fmnist::split train, test;
  try {
    train = fmnist::load(opt.data, "train", opt.limit);
    test = fmnist::load(opt.data, "t10k", 0);
  } catch (const fmnist::missing_data& e) {
    std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
    return 77;
  }

  // The model: the CNN is built from torch::nn layers and converted; the ViT uses dropit's types.
  std::shared_ptr<torch::nn::Module> net;
  std::function<torch::Tensor(torch::Tensor)> fwd;
  // --exclude: these layers keep LibTorch's dense saved input (e.g. the first layer, which sees
  // the raw image).
  auto excluded = [&opt](const std::string& path, const torch::nn::Module&) {
    return std::find(opt.exclude.begin(), opt.exclude.end(), path) != opt.exclude.end();
  };
  dt::convert_report report;
  if (opt.model == "cnn") {
    auto cnn = fmnist::make_cnn();
    dt::convert_options co;
    co.masks = opt.masks;
    co.fuse_pool_relu = opt.fuse_pool_relu;
    co.exclude = excluded;
    co.store = store;
    co.layer_gamma = opt.layer_gamma;
    try {
      report = dt::to_dropit(*cnn, policy, co);
    } catch (const dropit::error& e) {
      usage(e.what());
    }
    net = cnn.ptr();
    fwd = [cnn](torch::Tensor x) mutable { return cnn->forward(x); };
  } else {
    fmnist::ViT vit(64, 4, 4, 256, opt.relu_mlp, opt.masks && policy.active());
    dt::convert_options co;
    co.masks = opt.masks;
    co.exclude = excluded;
    co.store = store;
    co.layer_gamma = opt.layer_gamma;
    try {
      report = dt::to_dropit(*vit, policy, co);
    } catch (const dropit::error& e) {
      usage(e.what());
    }
    if (!opt.masks) {
      for (auto& m : vit->modules()) {
        if (auto* r = dynamic_cast<dt::ReLUImpl*>(m.get())) r->set_policy({});
      }
    }
    net = vit.ptr();
    fwd = [vit](torch::Tensor x) mutable { return vit->forward(x); };
  }
  for (const std::string& path : opt.exclude) {
    if (!net->named_modules().contains(path)) {
      usage("--exclude " + path + ": no such module (paths look like 0, patch, blocks.0.qkv)");
    }
  }
  const double lr = opt.lr > 0 ? opt.lr : 1e-3;
  torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(lr).weight_decay(
                                                       opt.model == "vit" ? 0.05 : 0.0));

  const std::int64_t n = train.images.size(0);
  const std::int64_t steps_per_epoch = (n + opt.batch - 1) / opt.batch;
  const std::int64_t total_steps = steps_per_epoch * opt.epochs;
  std::printf("fashion_mnist: model %s, policy %s", opt.model.c_str(), opt.policy.c_str());
  if (policy.kind == dt::policy_kind::mink || policy.kind == dt::policy_kind::random) {
    std::printf(" (gamma %.2f)", opt.gamma);
  }
  if (policy.active() && policy.codec != dropit::value_codec::exact)
    std::printf(", kept values %s", opt.codec.c_str());
  std::printf(
      ", masks %s, %lld training samples, batch %lld, %d epochs, %d threads, %zu dropit "
      "layers (%zu replaced)\n",
      opt.masks && policy.active() ? "on" : "off", static_cast<long long>(n),
      static_cast<long long>(opt.batch), opt.epochs, opt.threads, report.switched, report.replaced);
  if (report.fused > 0) std::printf("  MaxPool2d + ReLU fused: %zu pairs\n", report.fused);
  if (!opt.exclude.empty())
    std::printf("  excluded (dense saved input): %s\n", joined(opt.exclude).c_str());
  if (store.any()) {
    std::printf("  stored as %s: %s (%zu modules)\n", dt::to_string(store.codec).c_str(),
                dt::to_string(store).c_str(), report.stored);
  }

  progress bar(isatty(2) != 0);
  std::size_t max_activation = 0, max_peak = 0, max_held = 0, max_saved = 0;
  dt::saved_bytes max_cache;
  double first_loss = 0, last_loss = 0, train_seconds = 0, last_epoch_seconds = 0, accuracy = 0;
  std::vector<double> losses;
  std::vector<double> step_ms_all;  // data, forward, backward and optimiser of every step
  std::int64_t step = 0, measured_steps = 0;
  torch::Generator gen = at::detail::createCPUGenerator(opt.seed + 1);

  for (int epoch = 1; epoch <= opt.epochs; ++epoch) {
    const torch::Tensor order = torch::randperm(n, gen);
    double loss_sum = 0;
    std::int64_t seen = 0;
    const auto epoch_start = clock_type::now();
    for (std::int64_t b = 0; b < n; b += opt.batch, ++step) {
      // Cosine learning-rate decay over the whole run.
      const double lr_now =
          lr * 0.5 *
          (1.0 + std::cos(M_PI * static_cast<double>(step) / static_cast<double>(total_steps)));
      for (auto& group : optimizer.param_groups())
        group.options().set_lr(lr_now);

      const auto step_start = clock_type::now();
      const torch::Tensor idx = order.slice(0, b, std::min(n, b + opt.batch));
      const torch::Tensor x = train.images.index_select(0, idx);
      const torch::Tensor y = train.labels.index_select(0, idx);
      optimizer.zero_grad();

      // The step's memory: everything allocated from here to the end of backward, over what was
      // held before the forward pass (parameters, gradients, optimiser state, data, this batch).
      const std::size_t held = counter.reset_peak();
      torch::Tensor loss = torch::nn::functional::cross_entropy(fwd(x), y);
      const std::size_t after_forward = counter.current_bytes();
      const dt::saved_bytes cache = dt::live_saved_bytes();
      loss.backward();
      const std::size_t peak = counter.peak_bytes();
      optimizer.step();
      step_ms_all.push_back(
          std::chrono::duration<double, std::milli>(clock_type::now() - step_start).count());

      if (step > 0) {  // step 0 also allocates the gradients and the optimiser state
        max_activation = std::max(max_activation, peak - held);
        max_peak = std::max(max_peak, peak);
        max_held = std::max(max_held, held);
        max_saved = std::max(max_saved, after_forward - held);
        if (cache.total() > max_cache.total()) max_cache = cache;
        ++measured_steps;
      }
      const double l = loss.item<double>();
      losses.push_back(l);
      loss_sum += l * static_cast<double>(idx.size(0));
      seen += idx.size(0);
      const double secs = std::chrono::duration<double>(clock_type::now() - epoch_start).count();
      bar.update(epoch, opt.epochs, seen, n, loss_sum / static_cast<double>(seen),
                 static_cast<double>(seen) / secs);
    }
    last_epoch_seconds = std::chrono::duration<double>(clock_type::now() - epoch_start).count();
    train_seconds += last_epoch_seconds;
    accuracy = evaluate(*net, fwd, test);
    std::printf("epoch %d: train loss %.4f, test accuracy %.2f%%, %.1f s\n", epoch,
                loss_sum / static_cast<double>(seen), accuracy, last_epoch_seconds);
    std::fflush(stdout);
  }

  // Did the loss fall? Mean of the first and last fifth of all steps.
  const std::size_t fifth = std::max<std::size_t>(1, losses.size() / 5);
  first_loss = std::accumulate(losses.begin(), losses.begin() + fifth, 0.0) / double(fifth);
  last_loss = std::accumulate(losses.end() - fifth, losses.end(), 0.0) / double(fifth);
  const double step_ms = 1000.0 * train_seconds / static_cast<double>(step);
  // The median step resists the bursts of a shared machine better than the mean.
  std::vector<double> sorted_ms = step_ms_all;
  std::sort(sorted_ms.begin(), sorted_ms.end());
  const double step_ms_median = sorted_ms.empty() ? 0.0 : sorted_ms[sorted_ms.size() / 2];

  std::printf(
      "\n| model | policy | gamma | test acc %% | activation MiB | peak step MiB | saved "
      "after forward MiB | dropit cache MiB (sparse + masks) | median step ms | epoch s |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  std::printf("| %s | %s%s | %.2f | %.2f | %s | %s | %s | %s + %s | %.1f | %.1f |\n",
              opt.model.c_str(), opt.policy.c_str(),
              opt.masks || !policy.active() ? "" : " (no masks)", policy.active() ? opt.gamma : 0.0,
              accuracy, mib(double(max_activation)).c_str(), mib(double(max_peak)).c_str(),
              mib(double(max_saved)).c_str(), mib(double(max_cache.sparse)).c_str(),
              mib(double(max_cache.masks)).c_str(), step_ms_median, last_epoch_seconds);
  std::printf("loss fell: %s (first fifth %.4f, last fifth %.4f)\n",
              last_loss < first_loss ? "yes" : "no", first_loss, last_loss);

  if (!opt.csv.empty()) {
    const bool fresh = !std::ifstream(opt.csv).good();
    std::ofstream csv(opt.csv, std::ios::app);
    if (fresh) {
      csv << "date,model,policy,gamma,masks,mlp,seed,epochs,batch,samples,threads,test_acc,"
             "activation_bytes,peak_step_bytes,held_before_bytes,saved_after_forward_bytes,"
             "dropit_sparse_bytes,dropit_mask_bytes,step_ms,epoch_s,first_loss,last_loss,"
             "step_ms_median,exclude\n";
    }
    // --store goes into the policy field ("mink+store:layernorm;softmax:int8"): the columns of
    // earlier result files stay as they were.
    std::string stored = dt::to_string(store);
    std::replace(stored.begin(), stored.end(), ',', ';');
    csv << today() << ',' << opt.model << ',' << opt.policy
        << (policy.active() && policy.codec != dropit::value_codec::exact ? "+" + opt.codec
                                                                          : std::string())
        << (store.any() ? "+store:" + stored + ":" + dt::to_string(store.codec) : std::string())
        << layer_gammas(opt.layer_gamma) << ',' << (policy.active() ? opt.gamma : 0.0) << ','
        << (opt.masks && policy.active() ? "on" : "off") << ','
        << (opt.model == "vit" ? (opt.relu_mlp ? "relu" : "gelu") : "-") << ',' << opt.seed << ','
        << opt.epochs << ',' << opt.batch << ',' << n << ',' << opt.threads << ',' << accuracy
        << ',' << max_activation << ',' << max_peak << ',' << max_held << ',' << max_saved << ','
        << max_cache.sparse << ',' << max_cache.masks << ',' << step_ms << ',' << last_epoch_seconds
        << ',' << first_loss << ',' << last_loss << ',' << step_ms_median << ','
        << (opt.exclude.empty() ? std::string("-") : joined(opt.exclude)) << '\n';
  }
  (void)measured_steps;
  return last_loss < first_loss ? 0 : 1;
}
