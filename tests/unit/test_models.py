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
