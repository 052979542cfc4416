package template

import (
	"context"

	"github.com/torpor-dev/torpor"
)

// Copy makes template to with the files and defaults of template from: its
// layers are shared, nothing is unpacked again.
func (m *Manager) Copy(ctx context.Context, from, to string) (*torpor.Template, error) {
	if err := torpor.ValidateTemplateName("name", to); err != nil {
		return nil, err
	}
	release, err := m.reserve(ctx, to)
	if err != nil {
		return nil, err
	}
	defer release()
	src, err := m.store.GetTemplate(ctx, from)
	if err != nil {
		return nil, err
	}
	if len(src.Layers) == 0 {
		return nil, torpor.Errorf(torpor.EInvalid, "template %q is built in and cannot be copied", from)
	}
	// Pinned, the layers outlive a removal of from while the copy is made.
	var pinned []string
	for _, l := range src.Layers {
		if h, ok := m.layers.digestOf(l); ok {
			m.layers.pin(h)
			pinned = append(pinned, h)
		}
	}
	defer func() {
		for _, h := range pinned {
			m.layers.unpin(h)
		}
	}()
	if _, err := m.store.GetTemplate(ctx, from); err != nil {
		return nil, err
	}
	t := *src
	t.Name, t.InUse, t.CreatedAt = to, 0, m.now().UTC()
	if err := m.store.PutTemplate(context.WithoutCancel(ctx), t); err != nil {
		return nil, err
	}
	return &t, nil
}
