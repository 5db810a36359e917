import pytest
import torch

from workload.models import WideResNet, build_model, count_parameters


def test_reference_wide_resnet_matches_the_olivia_guide():
    model = WideResNet(num_classes=100)
    # The guide's network: 17.2 M parameters for 100 classes.
    assert 17_100_000 < count_parameters(model) < 17_300_000
    widths = [m.out_channels for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert {16, 160, 320, 640} == set(widths)
    dropouts = [m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    assert dropouts == [0.01] * 6  # two blocks in each of three stages


@pytest.mark.parametrize("name", ["wrn", "resnet18", "resnet50"])
def test_models_classify_32x32_images(name):
    model = build_model(name, num_classes=7, width=8, blocks_per_stage=1).eval()
    with torch.no_grad():
        logits = model(torch.randn(2, 3, 32, 32))
    assert logits.shape == (2, 7)


def test_small_image_stem_keeps_resolution():
    model = build_model("resnet18", num_classes=10)
    assert model.conv1.stride == (1, 1) and isinstance(model.maxpool, torch.nn.Identity)


def test_width_and_depth_options_scale_the_wrn():
    small = count_parameters(build_model("wrn", 10, width=8, blocks_per_stage=1))
    deeper = count_parameters(build_model("wrn", 10, width=8, blocks_per_stage=3))
    wider = count_parameters(build_model("wrn", 10, width=16, blocks_per_stage=1))
    assert small < deeper and small < wider


def test_wrn_accepts_larger_images():
    model = build_model("wrn", 5, width=8, blocks_per_stage=1).eval()
    with torch.no_grad():
        assert model(torch.randn(1, 3, 64, 64)).shape == (1, 5)


def test_resnet50_flops_follow_the_stem_for_the_image_size():
    # bench's counter on the configured model equals the count of the plain torchvision
    # ResNet-50 at 224 px (ImageNet stem) and of the small-image variant at 32 px.
    import torchvision
    from torch.utils.flop_counter import FlopCounterMode

    from workload.bench.train import flops_per_image
    from workload.config import build_config
    from workload.models import small_image_stem

    def count(model, size):
        with FlopCounterMode(display=False) as counter:
            model.to("meta")(torch.empty(2, 3, size, size, device="meta")).sum().backward()
        return counter.get_total_flops() / 2

    cfg = build_config(dict(model="resnet50", dataset="imagefolder"))
    at_224 = flops_per_image(cfg, 100, 224)
    at_32 = flops_per_image(cfg.replace(dataset="synthetic"), 100, 32)
    assert at_224 == count(torchvision.models.resnet50(num_classes=100), 224)
    assert at_32 == count(small_image_stem(torchvision.models.resnet50(num_classes=100)), 32)
    # The figures: 4.1 GMAC per 224-px image forward, 3x that with the backward.
    assert 3 * 4.0e9 * 2 < at_224 < 3 * 4.2e9 * 2


@pytest.mark.parametrize("size, stem", [(32, "small"), (63, "small"), (64, "imagenet"),
                                        (224, "imagenet")])
def test_auto_stem_follows_the_image_size(size, stem):
    from workload.config import build_config
    from workload.config import resolve_stem

    cfg = build_config(dict(model="resnet18", dataset="synthetic", image_size=size))
    assert resolve_stem(cfg) == stem
    assert resolve_stem(cfg.replace(model="wrn")) == "small"
    assert resolve_stem(cfg.replace(model="convnext_tiny")) == "imagenet"


def test_a_wrong_model_name_lists_close_matches():
    from workload.errors import UsageError
    from workload.models import check_model_name

    with pytest.raises(UsageError, match="did you mean.*efficientnet_b0"):
        check_model_name("efficientnet-b0")
    check_model_name("convnext_tiny")  # torchvision's registry, not a list of ours


def test_torchvision_models_get_a_head_for_the_classes():
    for name in ("mobilenet_v3_small", "googlenet"):
        model = build_model(name, num_classes=5, image_size=64).train()
        assert model(torch.randn(2, 3, 64, 64)).shape == (2, 5)


def test_init_from_loads_every_tensor_and_refuses_a_mismatch(tmp_path):
    from safetensors.torch import save_file

    from workload.errors import UsageError
    from workload.models import load_initial_weights, save_weights
    from workload.records import model_sha256

    source = build_model("resnet18", num_classes=10)
    save_weights(source, tmp_path / "model.safetensors", write=True)
    fresh = build_model("resnet18", num_classes=10)
    said = load_initial_weights(fresh, str(tmp_path / "model.safetensors"))
    assert f"{len(source.state_dict())} tensors" in said
    assert model_sha256(fresh) == model_sha256(source)

    other_head = build_model("resnet18", num_classes=3)
    with pytest.raises(UsageError, match=r"'fc.weight' is \[10, 512\] in the file but "
                                         r"\[3, 512\].*--init-reinit-head"):
        load_initial_weights(other_head, str(tmp_path / "model.safetensors"))
    said = load_initial_weights(other_head, str(tmp_path / "model.safetensors"),
                                reinit_head=True)
    assert "fc.bias, fc.weight started afresh" in said
    assert torch.equal(other_head.conv1.weight, source.conv1.weight)

    tensors = dict(source.state_dict())
    tensors["layer1.0.conv1.weight"] = torch.zeros(1)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp_path / "bad.safetensors"))
    with pytest.raises(UsageError, match="'layer1.0.conv1.weight' is \\[1\\]"):
        load_initial_weights(fresh, str(tmp_path / "bad.safetensors"), reinit_head=True)
    with pytest.raises(UsageError, match="'weight' of the model is missing from the file"):
        load_initial_weights(torch.nn.Linear(2, 2), str(tmp_path / "model.safetensors"))
    tensors = dict(source.state_dict(), extra=torch.zeros(1))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp_path / "more.safetensors"))
    with pytest.raises(UsageError, match="'extra' of the file is not in the model"):
        load_initial_weights(fresh, str(tmp_path / "more.safetensors"))


@pytest.mark.parametrize("tensor, words", [
    (torch.ones(2, 2, dtype=torch.int8), ["'weight'", "torch.int8", "torch.float32"]),
    (torch.ones(2, 2, dtype=torch.bool), ["'weight'", "torch.bool", "truncated"]),
    (torch.tensor([[1.0, float("nan")], [0.0, 1.0]]), ["'weight'", "NaN or infinite"]),
    (torch.tensor([[1.0, float("inf")], [0.0, 1.0]]), ["'weight'", "NaN or infinite"]),
])
def test_init_from_refuses_weights_it_would_truncate_or_that_are_not_finite(tmp_path, tensor,
                                                                            words):
    from safetensors.torch import save_file

    from workload.errors import UsageError
    from workload.models import load_initial_weights

    model = torch.nn.Linear(2, 2)
    save_file({"weight": tensor, "bias": torch.zeros(2)}, str(tmp_path / "w.safetensors"))
    before = model.weight.detach().clone()
    with pytest.raises(UsageError) as refused:
        load_initial_weights(model, str(tmp_path / "w.safetensors"))
    for word in words:
        assert word in str(refused.value)
    assert torch.equal(model.weight, before)  # refused before anything was loaded


def test_init_from_takes_weights_of_another_float_precision(tmp_path):
    from safetensors.torch import save_file

    from workload.models import load_initial_weights

    model = torch.nn.Linear(2, 2)
    save_file({"weight": torch.ones(2, 2, dtype=torch.bfloat16), "bias": torch.zeros(2)},
              str(tmp_path / "w.safetensors"))
    load_initial_weights(model, str(tmp_path / "w.safetensors"))
    assert torch.equal(model.weight, torch.ones(2, 2))
